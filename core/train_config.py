"""The settings every training run shares, with the same names in every domain.

A domain's training config is a frozen dataclass that *extends* :class:`TrainConfigBase` with its
own sections (the model, the tasks or the simulator, the engine's knobs). The shared part is:

* ``mode`` (``real`` / ``world_model`` / ``wmrl``), ``steps``, ``groups_per_step``, ``group_size``,
  ``learning_rate``, ``seed``;
* ``lora`` (:class:`LoraConfig`), ``logging`` (:class:`LoggingConfig`), ``checkpoint``
  (:class:`CheckpointConfig`) and ``corrector`` (:class:`~wmrl.core.corrector.CorrectorConfig`).

A *supervised* stage (a warm start before RL) extends the sibling :class:`SupervisedConfigBase`
instead: it shares ``lora``, ``logging``, ``checkpoint``, ``learning_rate``, ``seed`` and the resume
rules, but has no mode, groups or corrector (a setting that would do nothing is not offered).

Validation resolves the mode into the corrector (:func:`wmrl.core.modes.resolve_corrector`), so the
config object *is* what runs: ``config.corrector`` of a ``mode=real`` run anchors every group, and
``--print-config`` shows exactly that. A setting the mode contradicts is refused.

The resume rules live here too: a resumed run may change only the keys in :attr:`RESUMABLE`
(``steps``, ``logging``, ``checkpoint``, plus what a domain adds in its ``resumable`` class
attribute); anything else would make it a different run, and :meth:`TrainConfigBase.check_resume`
refuses it naming the keys.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from wmrl.core.config import ConfigError, require, to_dict
from wmrl.core.config import require_int as _int_at_least
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.modes import Mode, resolve_corrector

__all__ = [
    "REPORTERS",
    "RESUMABLE",
    "CheckpointConfig",
    "LoggingConfig",
    "LoraConfig",
    "SupervisedConfigBase",
    "TrainConfigBase",
    "flatten",
]

#: Experiment trackers a run can report to (each needs its package installed).
REPORTERS = ("tensorboard", "wandb", "mlflow", "trackio")
#: Keys (dotted prefixes) every resumed run may change.
RESUMABLE = ("steps", "logging", "checkpoint")
#: The corrector settings a config was loaded *from* (a preset, a file): a mode may override those;
#: only settings the user changed on top of them can contradict it. Set by :meth:`TrainConfigBase.baseline`.
_BASELINE: contextvars.ContextVar[Any] = contextvars.ContextVar("wmrl_corrector_baseline", default=None)


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the policy (PEFT); ``enabled=false`` trains the full model.

    Attributes:
        enabled: train LoRA adapters instead of every weight.
        r: adapter rank.
        alpha: LoRA scaling numerator (scale = alpha / r).
        dropout: dropout on the adapter input.
        target_modules: module names that get adapters.
        last_layers: adapters only in the last ``last_layers`` decoder layers (PEFT's
            ``layers_to_transform``); 0, or at least the model's layer count: every layer. The backward pass then stops below them, so an
            update costs the forward pass plus about ``last_layers / layers`` of the full backward.
    """

    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    last_layers: int = 0

    def __post_init__(self) -> None:
        _int_at_least(self.last_layers, "lora.last_layers", 0)
        _int_at_least(self.r, "lora.r", 1)
        _int_at_least(self.alpha, "lora.alpha", 1)
        require(0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1); got {self.dropout}")
        require(
            len(self.target_modules) > 0 and all(isinstance(m, str) and m for m in self.target_modules),
            "lora.target_modules must list at least one module name",
        )


@dataclass(frozen=True)
class LoggingConfig:
    """What a run reports besides ``metrics.jsonl``, ``config.json`` and ``cost_report.json``.

    Attributes:
        report_to: experiment trackers: any of tensorboard, wandb, mlflow, trackio (each needs its
            package); ``[]`` for none. TRL runs hand this to TRL's own reporting.
        progress: progress bars (training steps, and the phases within a step).
        plots: ``RUN/plots/*.png`` (calibration curve, fusion weights, reward) at the end of the run.
        completions: write the per-step completions table ``RUN/completions.jsonl`` (one row per
            rollout: what it was, the world-model score raw and calibrated, the real result, the reward
            and advantage used) and print a sample of it at each logging step.
        completions_to_print: rows of that sample printed per step.
    """

    report_to: tuple[str, ...] = ("tensorboard",)
    progress: bool = True
    plots: bool = True
    completions: bool = False
    completions_to_print: int = 4

    def __post_init__(self) -> None:
        unknown = [r for r in self.report_to if r not in REPORTERS]
        require(not unknown, f"logging.report_to: {unknown} unknown; choose from {list(REPORTERS)}")
        require(
            len(set(self.report_to)) == len(self.report_to), f"logging.report_to repeats: {self.report_to}"
        )
        _int_at_least(self.completions_to_print, "logging.completions_to_print", 0)


@dataclass(frozen=True)
class CheckpointConfig:
    """When a run writes checkpoints (each holds the policy, the optimiser, the correction and the ledger).

    Attributes:
        every: steps between checkpoints (``null``: only the final one).
        keep: newest checkpoints kept on disk (``null``: all).
    """

    every: int | None = None
    keep: int | None = 2

    def __post_init__(self) -> None:
        if self.every is not None:
            _int_at_least(self.every, "checkpoint.every", 1)
        if self.keep is not None:
            _int_at_least(self.keep, "checkpoint.keep", 1)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class _ResumeRules:
    """``to_dict`` and the resume rule shared by every run config (see :meth:`check_resume`)."""

    #: Top-level keys (dotted prefixes) a resumed run of this domain may change, besides RESUMABLE.
    resumable: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = to_dict(self)
        return data

    def check_resume(self, saved: Mapping[str, Any]) -> None:
        """Refuse to resume a run saved with config ``saved`` (a dict) under this config if they differ
        in anything but the resumable keys.

        Raises:
            ConfigError: naming the keys that differ.
        """
        refuse_resume_changes(saved, self.to_dict(), (*RESUMABLE, *self.resumable))


@dataclass(frozen=True)
class SupervisedConfigBase(_ResumeRules):
    """The shared part of a supervised stage's config (a warm start before RL; see the module docstring).

    Attributes:
        epochs: passes over the training examples.
        batch_size: examples per optimiser step.
        learning_rate: the optimiser's learning rate.
        seed: seed of the stage (data order, initialisation of the adapters).
        lora: adapters on the model (merged into it at the end of the stage).
        logging: trackers, progress and plots.
        checkpoint: checkpoint interval (in optimiser steps) and retention.
    """

    resumable: ClassVar[tuple[str, ...]] = ("epochs",)

    epochs: int = 1
    batch_size: int = 4
    learning_rate: float = 5e-4
    seed: int = 0
    lora: LoraConfig = field(default_factory=LoraConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        _int_at_least(self.epochs, "epochs", 1)
        _int_at_least(self.batch_size, "batch_size", 1)
        require(
            not self.logging.completions,
            "logging.completions is the RL completions table (both reward streams); a supervised stage has none",
        )
        require(self.learning_rate > 0, f"learning_rate must be > 0; got {self.learning_rate}")
        _int_at_least(self.seed, "seed", 0)


def _corrector_default(cls: type) -> CorrectorConfig:
    """The ``corrector`` a config class starts from (its field's default)."""
    f: dataclasses.Field[CorrectorConfig] = next(f for f in dataclasses.fields(cls) if f.name == "corrector")
    # without a default the field has a default_factory (every config class gives corrector one)
    if f.default is dataclasses.MISSING:
        return cast(Callable[[], CorrectorConfig], f.default_factory)()
    return f.default


@dataclass(frozen=True)
class TrainConfigBase(_ResumeRules):
    """The shared part of every domain's training config (see the module docstring).

    Attributes:
        mode: ``wmrl`` (world model + anchors + correction) | ``real`` (every group executed, the
            baseline) | ``world_model`` (the raw world model alone). It presets ``corrector``.
        steps: training steps (one batch of groups, one update each).
        groups_per_step: GRPO groups per step (distinct prompts or initial states).
        group_size: rollouts per group (G), >= 2.
        learning_rate: the optimiser's learning rate.
        seed: seed of the run (data order, sampling, anchors).
        lora: adapters on the policy.
        logging: trackers, progress, plots and the completions table.
        checkpoint: checkpoint interval and retention.
        corrector: the correction (anchor scheduler, debiasing, fusion, advantages), as resolved by the mode.
        corrector_preset: a named corrector configuration applied on top of ``corrector`` before the
            mode (:data:`wmrl.core.corrector.PRESETS`, e.g. ``paper``: the paper's configuration;
            ``wmrl_groups``: the design before the execution memory; ``real_cache`` with ``mode=real``:
            real execution with a result cache). ``null``: none.
    """

    mode: Mode = Mode.WMRL
    steps: int = 3
    groups_per_step: int = 2
    group_size: int = 4
    learning_rate: float = 1e-4
    seed: int = 0
    lora: LoraConfig = field(default_factory=LoraConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    corrector: CorrectorConfig = field(default_factory=CorrectorConfig)
    corrector_preset: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        if self.corrector_preset is not None:
            from wmrl.core.corrector import PRESETS

            name = self.corrector_preset
            require(
                name in PRESETS and name not in ("real", "world_model"),
                f"corrector_preset must be one of {sorted(p for p in PRESETS if p not in ('real', 'world_model'))}; "
                f"got {name!r} (the modes real and world_model are set with mode=...)",
            )
            object.__setattr__(self, "corrector", CorrectorConfig.preset(name, self.corrector))
        _int_at_least(self.steps, "steps", 1)
        _int_at_least(self.groups_per_step, "groups_per_step", 1)
        _int_at_least(self.group_size, "group_size", 2)
        require(self.learning_rate > 0, f"learning_rate must be > 0; got {self.learning_rate}")
        _int_at_least(self.seed, "seed", 0)
        require(
            self.corrector.advantages.min_graded <= self.group_size,
            f"corrector.advantages.min_graded ({self.corrector.advantages.min_graded}) exceeds group_size "
            f"({self.group_size}): no group could ever produce advantages",
        )
        # The mode is applied here, once: the object is the configuration that runs.
        defaults = _BASELINE.get()
        if defaults is None:
            defaults = _corrector_default(type(self))
        object.__setattr__(self, "corrector", resolve_corrector(self.mode, self.corrector, defaults))

    @classmethod
    @contextlib.contextmanager
    def baseline(cls, source: Mapping[str, Any]) -> Iterator[None]:
        """While active, configs treat the corrector settings of ``source`` (a preset's or a file's
        settings) as the starting point: the mode may override them (``--smoke mode=real``), while a
        corrector setting changed on top of them still contradicts the mode. Used by
        :func:`wmrl.core.config.load_config`."""
        from wmrl.core.config import from_dict

        default = _corrector_default(cls)
        section = source.get("corrector") if isinstance(source, Mapping) else None
        baseline = default
        if isinstance(section, Mapping) and section:
            from wmrl.core.modes import apply_changes

            try:
                baseline = from_dict(CorrectorConfig, to_dict(apply_changes(default, flatten(section))))
            except Exception:  # a broken section: the config's own validation reports it, by name
                baseline = default
            else:
                # A file (or preset) that names a mode and a corrector setting that mode contradicts
                # is refused as the command line would refuse it; only a mode given *over* the
                # source (``--smoke mode=real``) may override the source's corrector settings.
                own_mode = source.get("mode")
                if own_mode is not None:
                    resolve_corrector(own_mode, baseline, default)
        token = _BASELINE.set(baseline)
        try:
            yield
        finally:
            _BASELINE.reset(token)


def refuse_resume_changes(
    saved: Mapping[str, Any], current: Mapping[str, Any], allowed: Sequence[str]
) -> None:
    """Raise :class:`ConfigError` naming the keys in which the config dicts ``saved`` and ``current``
    differ, unless each is one of the dotted prefixes ``allowed`` (or below one)."""
    old, new = flatten(saved), flatten(current)
    differs = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    blocked = [k for k in differs if not any(k == a or k.startswith(a + ".") for a in allowed)]
    if blocked:
        raise ConfigError(
            f"the config differs from the one the run was started with in {blocked}; a resumed run may "
            f"change only {sorted(allowed)} (start a new run for anything else)"
        )
