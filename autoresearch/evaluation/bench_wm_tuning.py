"""The benchmark's tuned world model: per seed, the world model fine-tuned on anchor pairs that
another benchmark's runs recorded at the OTHER seeds (``wmrl bench autoresearch --wm-tuned-on DIR``).

Why leave one seed out: runs of one seed from one warm start sample the same first scripts, so a
world model tuned on a seed's own pairs would have seen (with their real outcomes) the very scripts
it is then asked to judge in that seed's first step. Leaving the seed out removes that overlap, at
the price of one tuning per seed (a script another seed also sampled can still be among the pairs:
the policy is the same). The pairs are training-task executions only (anchor
pairs of training runs); the held-out tasks never enter them (the tuning stage refuses foreign tasks).

The tuning is ``wmrl train autoresearch-sft`` with ``corpus.anchor_runs`` (:mod:`~wmrl.autoresearch.
training.sft`): LoRA on the world model the runs would otherwise use (``world_model.backend.path``,
or the starting policy when that is ``null``), with the world-model prompt settings of the runs, so
that it learns the exact prompt it is then asked. Each seed's tuning is kept in
``OUT/wm-tuned/s<seed>/`` (a warm-start run directory; ``final/`` is the world model).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wmrl.autoresearch.training.anchor_pairs import PAIRS_GLOB

__all__ = [
    "DEFAULT_TUNING",
    "finished_tuning",
    "source_identity",
    "source_runs",
    "tuned_dir",
    "tuning_config",
]

#: One pass over the pairs (about 10 s a pair on 2 CPU cores for SmolLM2-135M): the warm start's
#: three passes were sized for 60 agent examples, and a world model tuned longer on a few dozen
#: pairs learns their base rates (docs/benchmarks/autoresearch.md, the ``wm-fidelity`` section).
DEFAULT_TUNING: tuple[str, ...] = ("epochs=1",)

#: The tuning's settings the bench derives itself (``--wm-tuning`` may not change them: the corpus
#: override could bring a seed's own pairs back).
_SET_BY_THE_BENCH = ("model", "corpus", "seed")


def _seed_of(run: Path) -> int | None:
    config = run / "config.json"
    if not config.is_file():
        return None
    seed = json.loads(config.read_text()).get("seed")
    return seed if isinstance(seed, int) else None


def source_runs(source: str | Path, seed: int) -> list[Path]:
    """The runs of the benchmark folder ``source`` whose anchor pairs tune seed ``seed``'s world model:
    every run (``runs/*``) that recorded anchor pairs (``anchor_pairs*.jsonl``) at another seed
    (read from its ``config.json``), sorted by name.

    Raises:
        ConfigError: ``source`` holds no benchmark; no run of another seed recorded pairs; or one of
            those runs has not finished (no ``run_summary.json``): its pairs would still grow, so the
            tuning would depend on when it ran.
    """
    from wmrl.core.config import ConfigError

    source = Path(source)
    if not (source / "bench.json").is_file():
        raise ConfigError(f"--wm-tuned-on {source}: no benchmark there (no bench.json)")
    runs = sorted(p for p in (source / "runs").glob("*") if p.is_dir()) if (source / "runs").is_dir() else []
    chosen = [
        run for run in runs if any(run.glob(PAIRS_GLOB)) and (s := _seed_of(run)) is not None and s != seed
    ]
    if not chosen:
        raise ConfigError(
            f"--wm-tuned-on {source}: no run at a seed other than {seed} recorded anchor pairs "
            "(runs of mode real or wmrl do; the tuning leaves the run's own seed out)"
        )
    unfinished = [run.name for run in chosen if not (run / "run_summary.json").is_file()]
    if unfinished:
        raise ConfigError(
            f"--wm-tuned-on {source}: runs {unfinished} have not finished (no run_summary.json); finish "
            "that benchmark first (rerun its command), so that the pairs a tuning learns are final"
        )
    return chosen


def source_identity(runs: Sequence[Path]) -> list[str]:
    """``name#digest`` of each run's anchor pairs (their bytes): a benchmark continued after its
    source pairs changed is refused like one whose settings changed."""
    identity = []
    for run in runs:
        digest = hashlib.sha256()
        for path in sorted(run.glob(PAIRS_GLOB)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        identity.append(f"{run.name}#{digest.hexdigest()[:16]}")
    return identity


def tuned_dir(out: str | Path, seed: int) -> Path:
    """Where seed ``seed``'s tuning lives in the benchmark folder ``out``."""
    return Path(out) / "wm-tuned" / f"s{seed}"


def finished_tuning(dest: str | Path, config: Any) -> Path | None:
    """The tuned world model in ``dest`` (``dest/final``) when a tuning under ``config`` finished
    there; ``None`` when none finished (tune now, resuming what was started).

    A finished tuning is reused only if it was tuned with ``config``: the same settings (logging and
    checkpoint aside) and source runs of the same names. Where those runs live may differ (the bench
    pins their pairs by digest, ``source_identity``), so a source given by another path reuses it.

    Raises:
        ConfigError: the finished tuning has no model (``final/config.json``), or was tuned with other
            settings (``--force-settings`` changed them): remove ``dest`` to tune again.
    """
    from wmrl.core.config import ConfigError, to_dict
    from wmrl.core.train_config import refuse_resume_changes

    dest = Path(dest)
    if not (dest / "run_summary.json").is_file():
        return None
    final = dest / "final"
    if not (final / "config.json").is_file():
        raise ConfigError(
            f"{dest}: a finished tuning without its model ({final}); remove {dest} to tune again"
        )

    def comparable(data: dict) -> dict:
        corpus = dict(data.get("corpus", {}))
        corpus["anchor_runs"] = [Path(r).name for r in corpus.get("anchor_runs") or ()]
        return {**data, "corpus": corpus}

    saved = json.loads((dest / "config.json").read_text()) if (dest / "config.json").is_file() else {}
    try:
        refuse_resume_changes(comparable(saved), comparable(to_dict(config)), ("logging", "checkpoint"))
    except ConfigError as error:
        raise ConfigError(
            f"{dest} holds a world model tuned with other settings ({error}); remove {dest} to tune again"
        ) from None
    return final


def tuning_config(train_config: Any, base_model: str, runs: Sequence[Path], overrides: Sequence[str] = ()):
    """The ``WarmStartConfig`` that tunes ``base_model`` (a resolved model path) on ``runs``' pairs.

    Args:
        train_config: the benchmark runs' ``TrainConfig``: its training tasks, world-model prompt
            settings (overview budget, script budget, worked example) and model dtype/device are the
            tuning's, so the tuned model learns the exact prompt the runs then ask it.
        base_model: the world model being tuned.
        runs: run directories with anchor pairs (:func:`source_runs`).
        overrides: further ``key=value`` settings of the stage (``epochs=2``, ``learning_rate=...``).

    Raises:
        ConfigError: a setting the tuning cannot honour (tasks from an MLE-Dojo root or a data folder:
            the stage resolves bundled or folder tasks only), or a bad override.
    """
    from wmrl.autoresearch.training.sft import WarmStartConfig
    from wmrl.core.config import ConfigError, load_config

    tasks, wm = train_config.tasks, train_config.world_model
    if wm.backend.kind == "openai":
        raise ConfigError(
            "--wm-tuned-on: world_model.backend.kind=openai judges with the servers' model, not a tuned "
            "folder; use kind transformers or vllm"
        )
    fixed = [o for o in overrides if o.split("=", 1)[0].strip().split(".")[0] in _SET_BY_THE_BENCH]
    if fixed:
        raise ConfigError(
            f"--wm-tuning {fixed}: the bench sets the tuning's {', '.join(_SET_BY_THE_BENCH)} itself "
            "(the model, the leave-one-seed-out pairs, the runs' prompt settings and seed)"
        )
    if tasks.mledojo_root is not None or tasks.data_dir is not None:
        raise ConfigError(
            "--wm-tuned-on: tasks.mledojo_root / tasks.data_dir are not supported by the tuning stage "
            "(it resolves bundled or folder tasks); tune with wmrl train autoresearch-sft and pass "
            "world_model.backend.path instead"
        )
    data = {
        "model": {"path": base_model, "dtype": train_config.model.dtype, "device": train_config.model.device},
        "corpus": {
            "ids": list(tasks.ids),
            "limit": tasks.limit,
            "anchor_runs": [str(r) for r in runs],
            "overview_tokens": tasks.overview_tokens,
            "world_model_overview_tokens": wm.overview_tokens,
            "world_model_code_max_chars": wm.code_max_chars,
            "world_model_worked_example": wm.worked_example,
        },
        "seed": train_config.seed,
    }
    # the defaults first, so that another --wm-tuning setting keeps one epoch
    return load_config(WarmStartConfig, data, [*DEFAULT_TUNING, *overrides])
