"""VLA policies: the interface every policy implements, and the policies WMRL ships."""

from wmrl.embodied.policy.base import ActionStep, VLAPolicy
from wmrl.embodied.policy.random_policy import RandomPolicy

__all__ = ["ActionStep", "RandomPolicy", "VLAPolicy"]
