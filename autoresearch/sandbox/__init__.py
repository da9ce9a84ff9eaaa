"""Running untrusted solutions: sandboxes, limits, results and a pool with a result cache.

Usage::

    from wmrl.autoresearch.sandbox import Limits, make_sandbox, SandboxPool

    sb = make_sandbox("auto")   # bubblewrap where it works, Docker where an engine answers, else subprocess
    res = sb.run(code, data_dir, Limits(wall_time_s=60, memory_mb=2048))
    res.status, res.exit_code, res.submission, res.resources.wall_s, res.isolated, res.warnings

The solution's contract (every backend): ``DATA_DIR`` is the read-only public data folder,
``SUBMISSION_PATH`` the CSV file to write, and the working directory a fresh scratch folder.
Every backend runs solutions as a dedicated unprivileged user, under a seccomp filter, with the
separate solution environment (:mod:`.solution_env`: no ``wmrl``, no dataset files). See
``docs/sandbox.md`` for the protections each backend gives.
"""

from .base import CpuAllocator, Sandbox, SandboxError, execution_cores, set_execution_cores
from .bwrap import BwrapSandbox, bwrap_problem
from .docker_backend import DockerSandbox, docker_problem
from .environment import SOLUTION_LIBRARIES, available_libraries
from .factory import BACKENDS, backend_problems, make_sandbox
from .limits import THREAD_ENV_VARS, Limits
from .local import NO_ISOLATION_WARNING, SubprocessSandbox
from .pool import SandboxPool, cache_key, data_fingerprint
from .result import STATUSES, ExecutionResult, Resources
from .solution_env import SolutionEnv, SolutionEnvError
from .users import SandboxUser, UserPool

__all__ = [
    "BACKENDS",
    "NO_ISOLATION_WARNING",
    "SOLUTION_LIBRARIES",
    "STATUSES",
    "THREAD_ENV_VARS",
    "BwrapSandbox",
    "CpuAllocator",
    "DockerSandbox",
    "ExecutionResult",
    "Limits",
    "Resources",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxUser",
    "SolutionEnv",
    "SolutionEnvError",
    "SubprocessSandbox",
    "UserPool",
    "available_libraries",
    "backend_problems",
    "bwrap_problem",
    "cache_key",
    "data_fingerprint",
    "docker_problem",
    "execution_cores",
    "make_sandbox",
    "set_execution_cores",
]
