"""The corrector design before issue 32 (whole anchor groups, the mse fusion, no memory), for the
tests that exercise group anchors: the components' own class defaults, not the default method's."""

from wmrl.core.corrector import CorrectorConfig
from wmrl.core.fusion import FusionConfig
from wmrl.core.memory import MemoryConfig
from wmrl.core.scheduler import SchedulerConfig


def groups_config(**parts) -> CorrectorConfig:
    """``CorrectorConfig(**parts)`` with the group design wherever ``parts`` leave a section unset."""
    parts.setdefault("scheduler", SchedulerConfig())
    parts.setdefault("fusion", FusionConfig())
    parts.setdefault("memory", MemoryConfig(enabled=False))
    return CorrectorConfig(**parts)
