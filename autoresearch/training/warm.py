"""The embedded warm starts: ``smollm2-warm`` (scripts) and ``smollm2-warm-model`` (the model action),
built once by the SFT stage and cached.

``smollm2-warm`` is a model spec like ``smollm2``: the embedded SmolLM2-135M-Instruct after the
default warm start (``wmrl train autoresearch-sft`` with its embedded defaults, :class:`WarmStartConfig`).
The first use builds it (the corpus is executed, then the LoRA fine-tune runs) into
``$WMRL_CACHE/warm/<key>/`` — a normal run directory of ``wmrl train autoresearch-sft``, so its
``corpus.jsonl``, ``metrics.jsonl`` and plots can be read like any run's — and every later use loads
``<key>/final``. The key hashes the default config and the training tasks' definitions, so a changed
task suite or template version builds a new one. ``wmrl autoresearch warm-start`` builds it ahead
of time and prints where it is. ``smollm2-warm-model`` is the same stage with ``corpus.action=model``:
the agent examples are model blocks of the fixed pipeline (:mod:`.model_slot`), for GRPO runs with
``tasks.action=model``.

Concurrent first uses wait on a lock file instead of building twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Literal

__all__ = ["WARM_SPEC", "WARM_SPECS", "ensure_warm_start", "resolve_spec", "warm_start_dir"]

from wmrl.autoresearch.training.warm_specs import WARM_SPEC, WARM_SPECS
from wmrl.core.log import progress as progress_line


def _action(spec: str) -> Literal["script", "model"]:
    if spec not in WARM_SPECS:
        raise ValueError(f"no embedded warm start {spec!r}; there are {sorted(WARM_SPECS)}")
    return WARM_SPECS[spec]


def _config(spec: str = WARM_SPEC):
    from wmrl.autoresearch.training.sft import CorpusSection, WarmStartConfig
    from wmrl.core.train_config import LoggingConfig

    # The embedded defaults, without trackers (a cache entry is not an experiment to track).
    return WarmStartConfig(
        logging=LoggingConfig(report_to=(), plots=True), corpus=CorpusSection(action=_action(spec))
    )


def warm_start_dir(spec: str = WARM_SPEC) -> Path:
    """The cache folder of an embedded warm start (a ``wmrl train autoresearch-sft`` run directory)."""
    from wmrl.autoresearch.llm.models import cache_root
    from wmrl.autoresearch.training.corpus import corpus_key
    from wmrl.autoresearch.training.sft import _tasks
    from wmrl.core.config import to_dict

    config = _config(spec)
    tasks = [task for _, task in _tasks(config)]
    settings = to_dict(config)
    # Keys whose value changes nothing the warm start builds stay out of its key (a setting added
    # later with an inert default must not orphan every cached warm start).
    if not settings["corpus"].get("anchor_runs"):
        settings["corpus"].pop("anchor_runs", None)
    if settings["corpus"].get("action") == "script":
        settings["corpus"].pop("action", None)
    if not settings["lora"].get("last_layers"):
        settings["lora"].pop("last_layers", None)
    if not settings["sandbox"].get("cores"):
        settings["sandbox"].pop("cores", None)
    key = corpus_key(tasks, settings)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:6]
    kind = "" if spec == WARM_SPEC else "model-"
    return cache_root() / "warm" / f"smollm2-135m-sft-{kind}{key}{digest}"


def _done(folder: Path) -> bool:
    return (folder / "final" / "wmrl_policy.json").is_file() and (folder / "run_summary.json").is_file()


def ensure_warm_start(
    log=progress_line, progress: bool = True, rebuild: bool = False, spec: str = WARM_SPEC
) -> Path:
    """The warm-started policy folder of ``spec``, built first if it is not cached (see the module docstring)."""
    import fcntl

    folder = warm_start_dir(spec)
    if _done(folder) and not rebuild:
        return folder / "final"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building it: wait, then use its result
        if _done(folder) and not rebuild:
            return folder / "final"
        from wmrl.autoresearch.training.sft import run_sft

        building = folder.with_name(folder.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        log(
            f"[wmrl] building the warm start '{spec}' once (the defaults of `wmrl train autoresearch-sft`"
            f"{'' if spec == WARM_SPEC else ' corpus.action=model'}); it is cached in {folder}"
        )
        result = run_sft(_config(spec), building, log=log, progress=progress)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(building, folder)
        log(
            f"[wmrl] warm start built in {result.wall_s:.0f} s (loss {result.loss_first:.3f} -> {result.loss_last:.3f})"
        )
    return folder / "final"


def resolve_spec(spec: str | os.PathLike, log=progress_line, progress: bool = True) -> str:
    """``spec`` itself, or the cached warm start's folder for one of :data:`WARM_SPECS` (built on first use)."""
    if str(spec) in WARM_SPECS:
        return str(ensure_warm_start(log=log, progress=progress, spec=str(spec)))
    return str(spec)
