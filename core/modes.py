"""The three training modes every domain and engine shares, and the one place they map to the corrector.

* ``real``: GRPO on real execution only, the baseline. Every group is an anchor group; the world
  model is not needed (a trainer calls it only when given one, for diagnostics); no fusion.
* ``world_model``: GRPO on the raw world model only. Nothing is executed; no calibration, no fusion.
* ``wmrl``: the method. A thin anchor stream, isotonic debiasing, fusion, as the corrector is configured.

A mode is a *preset over* the corrector configuration: :func:`resolve_corrector` applies it and
refuses a setting the user gave that the mode contradicts (``mode=world_model`` with
``corrector.fusion.mode=paper`` is an error, not a silent overwrite), so the resolved configuration
is exactly what runs. ``sparse`` (the embodied domain's old name of ``real``) is accepted with a
deprecation warning.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from wmrl.core.config import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from wmrl.core.corrector import CorrectorConfig

_Config = TypeVar("_Config", bound="DataclassInstance")

__all__ = ["MODE_PRESETS", "Mode", "apply_changes", "check_mode", "resolve_corrector", "resolve_memory"]

#: Deprecated names of modes, and what they mean now.
DEPRECATED_ALIASES = {"sparse": "real"}


class Mode(StrEnum):
    """``real`` | ``world_model`` | ``wmrl`` (see the module docstring)."""

    REAL = "real"
    WORLD_MODEL = "world_model"
    WMRL = "wmrl"

    @classmethod
    def _missing_(cls, value: object) -> Mode | None:
        if isinstance(value, str) and value in DEPRECATED_ALIASES:
            new = DEPRECATED_ALIASES[value]
            warnings.warn(
                f"mode {value!r} is deprecated; it is now called {new!r}", DeprecationWarning, stacklevel=3
            )
            return cls(new)
        return None

    @classmethod
    def parse(cls, value: Mode | str) -> Mode:
        """The mode named ``value``; a clear error naming the known modes otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"mode must be one of {[m.value for m in cls]}; got {value!r}") from None

    @property
    def executes(self) -> bool:
        """Whether real execution (the anchor source) runs in this mode."""
        return self is not Mode.WORLD_MODEL

    @property
    def needs_world_model(self) -> bool:
        """Whether the world model grades the groups that train the policy."""
        return self is not Mode.REAL


#: What each mode sets in the corrector configuration, as dotted keys (``scheduler.fraction``).
MODE_PRESETS: dict[Mode, dict[str, Any]] = {
    Mode.WMRL: {},
    # real executes whole groups: per-rollout anchors would need world-model scores to choose from
    Mode.REAL: {"scheduler.fraction": 1.0, "scheduler.rollout_share": 0.0, "fusion.mode": "none"},
    Mode.WORLD_MODEL: {
        "scheduler.fraction": 0.0,
        "scheduler.floor": 0,
        "scheduler.rollout_share": 0.0,
        "debias.enabled": False,
        "fusion.mode": "none",
    },
}


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def apply_changes(config: _Config, changes: Mapping[str, Any]) -> _Config:
    """``config`` (a nested frozen dataclass) with the dotted ``changes`` applied, validated anew."""
    nested: dict[str, Any] = {}
    for dotted, value in changes.items():
        head, _, rest = dotted.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            nested[head] = value
    updates = {
        name: apply_changes(getattr(config, name), value) if isinstance(value, dict) else value
        for name, value in nested.items()
    }
    return dataclasses.replace(config, **updates)


def resolve_corrector(
    mode: Mode | str, config: CorrectorConfig, defaults: CorrectorConfig | None = None
) -> CorrectorConfig:
    """The corrector configuration ``mode`` runs with: its preset applied on ``config``.

    Args:
        mode: the training mode.
        config: the corrector configuration as the user gave it.
        defaults: the configuration the user started from (the domain's default corrector). A key the
            preset sets and the user changed from ``defaults`` to another value is a contradiction.

    Raises:
        ConfigError: the user set a key the mode fixes to something else.
    """
    mode = Mode.parse(mode)
    preset = MODE_PRESETS[mode]
    if defaults is not None:
        clashes = [
            f"corrector.{key}={_get(config, key)!r} (mode {mode.value} sets {value!r})"
            for key, value in preset.items()
            if _get(config, key) != _get(defaults, key) and _get(config, key) != value
        ]
        if clashes:
            raise ConfigError(
                f"mode {mode.value!r} contradicts {', '.join(clashes)}: drop those settings or choose another mode"
            )
    resolved = resolve_memory(mode, apply_changes(config, preset))
    check_mode(mode, resolved)
    return resolved


def resolve_memory(mode: Mode | str, config: CorrectorConfig) -> CorrectorConfig:
    """``memory.enabled`` left unset becomes the mode's choice: on in ``wmrl``, off in ``real`` (plain
    real-execution GRPO; ``memory.enabled=true`` makes it GRPO with a result cache) and ``world_model``."""
    mode = Mode.parse(mode)
    if config.memory.enabled is not None:
        return config
    return apply_changes(config, {"memory.enabled": mode is Mode.WMRL})


def check_mode(mode: Mode | str, config: CorrectorConfig | Any) -> None:
    """Reject a corrector configuration (or a corrector) that contradicts ``mode``; build it with
    :func:`resolve_corrector`."""
    mode = Mode.parse(mode)
    config = getattr(config, "config", config)  # a Corrector holds its configuration
    sched = config.scheduler
    if mode is Mode.REAL and sched.fraction != 1.0:
        raise ConfigError(
            f"mode 'real' executes every group, but corrector.scheduler.fraction is {sched.fraction}"
        )
    if mode is Mode.WORLD_MODEL and (sched.fraction != 0.0 or sched.floor != 0):
        raise ConfigError(
            "mode 'world_model' executes nothing, but the corrector schedules anchors "
            f"(scheduler.fraction {sched.fraction}, scheduler.floor {sched.floor})"
        )
    if mode is Mode.WORLD_MODEL and config.memory.enabled:
        raise ConfigError(
            "mode 'world_model' executes nothing, so an execution memory (corrector.memory.enabled=true) "
            "would only grade from outcomes other runs executed: leave memory.enabled unset or false"
        )
    if mode is Mode.WMRL and sched.fraction == 0.0 and sched.floor == 0:
        raise ConfigError(
            "mode 'wmrl' needs an anchor stream, but corrector.scheduler.fraction and .floor are both 0 "
            "(that is mode 'world_model')"
        )
    if mode is Mode.WMRL and sched.fraction == 1.0:
        raise ConfigError(
            "mode 'wmrl' with corrector.scheduler.fraction 1.0 executes every group: use mode 'real'"
        )
