"""A solution environment for the lent GPU machine, which has no network to build one by the recipe.

``python -m wmrl.autoresearch.sandbox.make_solution_env create`` pip-installs the pinned libraries of
``docs/sandbox.md`` into a fresh venv and prunes their data files. The lent GPU machine (see
``docs/benchmarks/gpu.md``, "The GPU check") reaches no package index, and the pinned wheels do not fit
in what a call may carry. So this builds a venv on the system interpreter whose site-packages
*links* every entry of the machine image's own site-packages (its numpy, pandas, scikit-learn,
torch, ...) plus the folders given with ``--extra`` (lightgbm, carried as a wheel), leaving out the
distributions a solution must never see (``FORBIDDEN_DISTRIBUTIONS``: the image's ``seaborn``,
``torchvision``, ``datasets``...), and writes the manifest a sandbox checks.

What it is NOT: the recipe's environment. Library versions are the image's, nothing is pruned (the
image's packages keep their test data), and only the forbidden distributions are hidden. Numbers
measured with it say so. Run with the interpreter whose site-packages are linked::

    WMRL_SOLUTION_ENV=/tmp/wmrl-device/solution-env python3 benchmarks/device/solution_env_shim.py --extra DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import site
import subprocess
import sys
import time
from pathlib import Path

from wmrl.autoresearch.sandbox.solution_env import (
    FORBIDDEN_DISTRIBUTIONS,
    MANIFEST_NAME,
    SYSTEM_PYTHON,
    SolutionEnv,
    default_path,
    recipe_digest,
)


def _normalised(name: str) -> str:
    return name.lower().replace("_", "-")


def _hidden_entries(site_dir: Path) -> set[str]:
    """Top-level entries of ``site_dir`` that belong to a forbidden distribution (its files' first
    path component: the package folders and the ``.dist-info`` folder)."""
    forbidden = {_normalised(d) for d in FORBIDDEN_DISTRIBUTIONS}
    hidden: set[str] = set()
    for dist in importlib.metadata.distributions(path=[str(site_dir)]):
        if _normalised(dist.metadata["Name"] or "") in forbidden:
            # RECORD lists the .dist-info folder's own files too
            hidden.update(Path(str(f)).parts[0] for f in dist.files or ())
    return hidden


def base_interpreter() -> str:
    """The system interpreter this one runs on (a venv's base), else :data:`SYSTEM_PYTHON`: the linked
    libraries' compiled modules load only in the Python version they were built for."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return base if base.startswith("/usr/") else SYSTEM_PYTHON


def build(target: Path, sources: list[Path]) -> SolutionEnv:
    """A venv at ``target`` on :func:`base_interpreter` linking ``sources``' entries (first wins)."""
    python = base_interpreter()
    version = subprocess.run(
        [python, "-c", "import sys; print('{}.{}'.format(*sys.version_info[:2]))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if version != "{}.{}".format(*sys.version_info[:2]):
        raise SystemExit(
            f"{python} is Python {version}, but the linked libraries are this interpreter's "
            f"({sys.version.split()[0]}): their compiled modules would not load"
        )
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(target)], check=True)
    env_site = next(target.glob("lib/python3*/site-packages"))
    linked: dict[str, str] = {}
    for source in sources:
        hidden = _hidden_entries(source)
        for entry in sorted(source.iterdir()):
            name = entry.name
            if name in hidden or name in linked or name == "__pycache__" or name.endswith(".pth"):
                continue
            (env_site / name).symlink_to(entry)
            linked[name] = str(source)
    manifest = {
        "digest": recipe_digest(python),
        "base_python": python,
        "device_shim": "the machine image's libraries linked (benchmarks/device/solution_env_shim.py); not pruned",
        "linked_from": [str(s) for s in sources],
        "linked_entries": len(linked),
        "python_version": version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (target / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    env = SolutionEnv(target)  # the checks every sandbox makes (system interpreter, no forbidden dists)
    manifest["distributions"] = env.libraries()
    (target / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extra", type=Path, action="append", default=[], help="another folder to link")
    args = parser.parse_args()
    image_site = next(Path(p) for p in site.getsitepackages() if Path(p).is_dir())
    target = default_path()
    if "WMRL_SOLUTION_ENV" not in os.environ:
        raise SystemExit("set WMRL_SOLUTION_ENV to the shim's folder (never the recipe's default path)")
    env = build(target, [*args.extra, image_site])
    libs = env.libraries()
    wanted = ("numpy", "pandas", "scipy", "scikit-learn", "lightgbm", "statsmodels", "torch")
    print(json.dumps({"solution_env": str(target), "libraries": {k: libs.get(k) for k in wanted}}))


if __name__ == "__main__":
    main()
