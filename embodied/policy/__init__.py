"""VLA policies: the interface every policy implements, and the policies WMRL ships."""

from wmrl.embodied.policy.base import ActionStep, VLAPolicy

__all__ = ["ActionStep", "VLAPolicy"]
