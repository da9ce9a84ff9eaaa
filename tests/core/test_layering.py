"""Layering and packaging rules: core stands alone; every package is installed; the CLI lists its commands."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_ONLY = """
import sys, importlib.abc
BLOCKED = {"pandas", "transformers", "trl", "peft", "datasets", "accelerate", "matplotlib", "tensorboard",
           "robosuite", "libero", "mujoco", "gymnasium", "docker", "ray", "vllm", "verl", "tqdm", "gguf", "imageio"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not a base dependency")
sys.meta_path.insert(0, Block())
import pkgutil, importlib, wmrl.core
# Engine adapters (wmrl.core.engines.<engine>) need their engine; everything else is base-only.
for mod in pkgutil.walk_packages(wmrl.core.__path__, "wmrl.core.", onerror=lambda name: None):
    if mod.name.startswith("wmrl.core.engines."):
        continue
    importlib.import_module(mod.name)
from wmrl.core.cli import build_parser
build_parser()  # registering every plugin's commands must not need an extra either
print("ok")
"""


def test_core_never_imports_the_domain_packages():
    offenders = []
    for path in (ROOT / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[:2] in (["wmrl", "autoresearch"], ["wmrl", "embodied"]) or name.split(".")[
                    0
                ] in ("autoresearch", "embodied"):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


def _imports(folder):
    """(path, imported module) for every import statement under ``folder``."""
    for path in (ROOT / folder).rglob("*.py"):
        if "fidelity/corpus" in path.as_posix():  # solution scripts with deliberate errors, not our code
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module:
                yield path, node.module


def test_the_domains_never_import_each_other():
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for folder, other in (("autoresearch", "embodied"), ("embodied", "autoresearch"))
        for path, name in _imports(folder)
        if name.split(".")[:2] == ["wmrl", other] or name.split(".")[0] == other
    ]
    assert not offenders, offenders


def test_engine_adapters_import_with_their_engine():
    pytest.importorskip("trl")
    import wmrl.core.engines.trl as trl_engine

    assert trl_engine.WMRLGRPOTrainer.__module__ == "wmrl.core.engines.trl.trainer"


def test_core_and_the_cli_import_with_only_the_base_dependencies():
    result = subprocess.run([sys.executable, "-c", BASE_ONLY], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_cli_help_lists_the_commands():
    result = subprocess.run(
        [sys.executable, "-m", "wmrl.core.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "bench" in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "wmrl.core.cli", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "synthetic" in result.stdout and "overhead" in result.stdout


def test_architecture_doc_lists_every_metric():
    from wmrl.core.corrector import METRICS
    from wmrl.core.late import ASYNC_METRICS

    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [k for k in [*METRICS, *ASYNC_METRICS] if f"`{k}`" not in doc]
    assert not missing, f"document these metrics in docs/architecture.md: {missing}"


def test_wheel_contains_every_package(tmp_path):
    """A normal (non-editable) install must ship the same packages as the editable one."""
    import zipfile

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = next(tmp_path.glob("wmrl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in config["packages"]:
        assert package.replace(".", "/") + "/__init__.py" in names, f"{package} missing from the wheel"
    assert "wmrl/core/cli.py" in names


def test_test_file_names_are_unique():
    """pytest imports test files by basename (no __init__.py in tests/): a duplicate breaks collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"rename these test files so their names are unique: {duplicates}"


def test_trl_is_pinned_to_the_minor_version_the_engine_overrides():
    """The TRL engine overrides private methods of one TRL minor version: pyproject pins exactly that."""
    import re

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    spec = next(d for d in config["project"]["optional-dependencies"]["autoresearch"] if d.startswith("trl"))
    source = (ROOT / "core" / "engines" / "trl" / "trainer.py").read_text()
    supported = re.search(r'SUPPORTED_TRL = "([\d.]+)"', source).group(1)
    major, minor = (int(x) for x in supported.split("."))
    assert spec.replace(" ", "") == f"trl>={major}.{minor},<{major}.{minor + 1}", spec
    trl = pytest.importorskip("trl")
    assert ".".join(trl.__version__.split(".")[:2]) == supported, "the installed TRL is not the pinned one"


def test_version_flag():
    result = subprocess.run(
        [sys.executable, "-m", "wmrl.core.cli", "--version"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.startswith("wmrl ")
