"""The WMRL side of a verl run: which sources, which corrector (loadable without verl installed).

verl's own configuration (Hydra/OmegaConf) has no place for Python objects, so a verl run names
WMRL's pieces in a small file whose path is in the ``WMRL_VERL_CONFIG`` environment variable (set
it for the Ray workers too: ``ray_kwargs.ray_init.runtime_env.env_vars``). Factories are
``"module:function"`` strings, imported where they are needed (the reward-loop workers build the
world model; the trainer process builds the anchor and the corrector).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wmrl.core.config import require
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.modes import Mode

__all__ = ["ENV_VAR", "VerlConfig", "load_object"]

#: The environment variable holding the path of the :class:`VerlConfig` file (YAML, JSON or TOML).
ENV_VAR = "WMRL_VERL_CONFIG"


def load_object(spec: str) -> Any:
    """Import ``"package.module:attribute"`` (the attribute may be dotted)."""
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ValueError(f"expected 'module:attribute'; got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def _spec(value: str | None, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    require(
        isinstance(value, str) and ":" in value and all(value.partition(":")[::2]),
        f"{name} must be 'module:function'; got {value!r}",
    )


@dataclass(frozen=True)
class VerlConfig:
    """What the WMRL plug-in of a verl run uses.

    Attributes:
        world_model: ``"module:factory"``; ``factory()`` returns the world-model reward source
            (built once in each reward-loop worker).
        anchor: ``"module:factory"``; ``factory()`` returns the real-execution source (built once in
            the trainer process; point it at a Ray pool to run executions on sandbox nodes).
        item_fn: ``"module:function"``; ``function(response_text, row) -> item`` (what both sources
            grade; ``row`` holds the sample's non-tensor fields: ``data_source``, ``extra_info``...).
            ``null``: the response text itself.
        mode: ``real`` | ``world_model`` | ``wmrl``.
        corrector: the corrector (the mode's preset is applied on top).
    """

    world_model: str | None = None
    anchor: str | None = None
    item_fn: str | None = None
    mode: Mode = Mode.WMRL
    corrector: CorrectorConfig = field(default_factory=CorrectorConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        _spec(self.world_model, "world_model", optional=self.mode is Mode.REAL)
        _spec(self.anchor, "anchor", optional=self.mode is Mode.WORLD_MODEL)
        _spec(self.item_fn, "item_fn", optional=True)

    @classmethod
    def from_env(cls) -> VerlConfig:
        """The config named by ``$WMRL_VERL_CONFIG`` (one-line error when it is not set)."""
        from wmrl.core.config import load_config

        path = os.environ.get(ENV_VAR)
        if not path:
            raise RuntimeError(
                f"the WMRL verl plug-in needs ${ENV_VAR}: the path of a file naming the world model, the anchor "
                "and the corrector (docs/scale-out.md); pass it to the Ray workers through "
                "ray_kwargs.ray_init.runtime_env.env_vars"
            )
        config: VerlConfig = load_config(cls, Path(path))
        return config

    def item_function(self) -> Callable[[str, dict[str, Any]], Any]:
        if self.item_fn is None:
            return lambda text, row: text
        fn: Callable[[str, dict[str, Any]], Any] = load_object(self.item_fn)
        return fn
