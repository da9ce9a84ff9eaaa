"""The solution's environment: the scrubbed variables it gets, and the libraries it can import.

The environment is built from an allow-list, never copied from the host: no API keys, tokens,
proxy settings or paths of the trainer reach the solution.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

from .limits import Limits

__all__ = ["SOLUTION_LIBRARIES", "available_libraries", "interpreter_roots", "sandbox_env"]

# Libraries a solution may use, in the order an agent's prompt should list them:
# (import name, distribution name). Only those installed in the sandbox's interpreter are offered.
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


def available_libraries() -> dict[str, str]:
    """``{import name: version}`` of :data:`SOLUTION_LIBRARIES` installed in this interpreter.

    The sandboxes run this same interpreter (its prefix bound read-only), so what is installed
    here is exactly what a solution can import. Meant for the agent's prompt.
    """
    out = {}
    for module, dist in SOLUTION_LIBRARIES:
        for name in (dist, *_ALT_DISTRIBUTIONS.get(module, ())):
            try:
                out[module] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


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
        "PATH": f"{python_bin_dir}:/usr/local/bin:/usr/bin:/bin",
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


def interpreter_roots() -> list[Path]:
    """The directories that hold this interpreter and its libraries (to bind read-only).

    ``sys.prefix`` (the venv), ``sys.base_prefix`` (the interpreter it was made from) and the
    real location of ``sys.executable``; nested entries are dropped. Directories named on
    ``sys.path`` outside these (an editable install's source tree, the current directory) are
    deliberately *not* included: they may hold the very answers the sandbox hides.
    """
    candidates = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    real_exe = Path(os.path.realpath(sys.executable))
    candidates.add(real_exe.parent.parent)
    resolved = sorted(
        {Path(os.path.realpath(p)) for p in candidates} | candidates, key=lambda p: len(p.parts)
    )
    roots: list[Path] = []
    for p in resolved:
        if not p.is_dir() or p == Path("/"):
            continue
        if any(p == r or r in p.parents for r in roots):
            continue
        roots.append(p)
    return roots
