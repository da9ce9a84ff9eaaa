"""LIBERO environments: a gymnasium wrapper, the suites and their initial states, the in-domain/held-out split.

Heavy dependencies (robosuite, MuJoCo, LIBERO) are imported when a simulator is first built, not
when this package is imported.
"""

from wmrl.embodied.env.config import DEFAULT_CAMERAS, LiberoEnvConfig, parse_cameras
from wmrl.embodied.env.images import ORIENTATIONS, orient_image
from wmrl.embodied.env.libero_env import NOOP_ACTION, LiberoEnv, quat_to_axis_angle
from wmrl.embodied.env.libero_setup import LiberoPaths, LiberoUnavailableError, prepare_libero
from wmrl.embodied.env.splits import IN_DOMAIN_STATES, NUM_INIT_STATES, SPLITS, split_of, states_for_split
from wmrl.embodied.env.suites import (
    DEFAULT_SUITE,
    SUITE_MAX_STEPS,
    SUITE_NUM_TASKS,
    SUITES,
    TaskInfo,
    get_task,
    list_tasks,
    load_init_states,
)

__all__ = [
    "DEFAULT_CAMERAS",
    "DEFAULT_SUITE",
    "IN_DOMAIN_STATES",
    "NOOP_ACTION",
    "NUM_INIT_STATES",
    "ORIENTATIONS",
    "SPLITS",
    "SUITES",
    "SUITE_MAX_STEPS",
    "SUITE_NUM_TASKS",
    "LiberoEnv",
    "LiberoEnvConfig",
    "LiberoPaths",
    "LiberoUnavailableError",
    "TaskInfo",
    "get_task",
    "list_tasks",
    "load_init_states",
    "orient_image",
    "parse_cameras",
    "prepare_libero",
    "quat_to_axis_angle",
    "split_of",
    "states_for_split",
]
