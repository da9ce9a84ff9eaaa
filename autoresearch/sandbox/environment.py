"""The solution's environment: the scrubbed variables it gets, the libraries it can import, and
the parts of the host system a sandbox shows it.

The environment is built from an allow-list, never copied from the host: no API keys, tokens,
proxy settings or paths of the trainer reach the solution. The interpreter is the separate
solution environment (:mod:`.solution_env`), never the trainer's.
"""

from __future__ import annotations

import functools
import os
import subprocess

from .limits import Limits
from .solution_env import SolutionEnv, SolutionEnvError

__all__ = ["SOLUTION_LIBRARIES", "available_libraries", "sandbox_env", "system_paths"]

# Libraries a solution may use, in the order an agent's prompt should list them:
# (import name, distribution name). Only those installed in the solution environment are offered.
SOLUTION_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("numpy", "numpy"),
    ("pandas", "pandas"),
    ("scipy", "scipy"),
    ("sklearn", "scikit-learn"),
    ("xgboost", "xgboost"),
    ("lightgbm", "lightgbm"),
    ("statsmodels", "statsmodels"),
    ("pyarrow", "pyarrow"),
    ("torch", "torch"),
    ("matplotlib", "matplotlib"),
)

# xgboost is published both as ``xgboost`` and as the CPU-only ``xgboost-cpu``.
_ALT_DISTRIBUTIONS = {"xgboost": ("xgboost-cpu",)}


def available_libraries(env: SolutionEnv | str | os.PathLike | None = None) -> dict[str, str]:
    """``{import name: version}`` of :data:`SOLUTION_LIBRARIES` in the solution environment.

    Every backend runs that environment, so this is exactly what a solution can import; meant
    for the agent's prompt. Empty when no solution environment is built (``env`` None: the
    default one).
    """
    try:
        env = env if isinstance(env, SolutionEnv) else SolutionEnv.find(env)
    except SolutionEnvError:
        return {}
    installed = env.libraries()
    out = {}
    for module, dist in SOLUTION_LIBRARIES:
        for name in (dist, *_ALT_DISTRIBUTIONS.get(module, ())):
            if name in installed:
                out[module] = installed[name]
                break
    return out


@functools.lru_cache(maxsize=8)
def _stdlib_dir(base_python: str) -> str:
    done = subprocess.run(
        [base_python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def system_paths(env: SolutionEnv) -> list[str]:
    """The host folders under ``/usr`` a sandbox binds read-only (at the same paths).

    Not all of ``/usr``: only executables, the shared libraries, the base interpreter's standard
    library, the C.UTF-8 locale and the time zones. Everything else a host may keep there
    (documentation, other languages' packages, SDKs, data files) stays out of sight.
    """
    import sysconfig

    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates = [
        "/usr/bin",
        f"/usr/lib/{multiarch}" if multiarch else "/usr/lib",
        "/usr/lib64",
        _stdlib_dir(str(env.base_python)),
        "/usr/lib/locale",
        "/usr/share/zoneinfo",
    ]
    return [p for p in dict.fromkeys(candidates) if os.path.isdir(p)]


def sandbox_env(
    limits: Limits,
    *,
    data_dir: str,
    submission_path: str,
    work_dir: str,
    tmp_dir: str,
    python_bin_dir: str,
    cuda_visible_devices: str | None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of a solution (nothing else is inherited).

    ``cuda_visible_devices``: ``None`` leaves the variable unset (the backend exposes exactly the
    GPUs it should); a string (``""`` for none) sets it.
    """
    env = {
        "DATA_DIR": data_dir,
        "SUBMISSION_PATH": submission_path,
        "HOME": work_dir,
        "TMPDIR": tmp_dir,
        "PATH": f"{python_bin_dir}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": f"{tmp_dir}/matplotlib",
        **limits.thread_env(),
    }
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if extra:
        env.update(extra)
    return env
