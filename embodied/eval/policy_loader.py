"""Turn ``--policy random|scripted|PATH`` into a policy object.

A saved policy is a folder with a ``policy.json``::

    {"type": "minivla", "kwargs": {...}}                 # a registered type
    {"type": "mine", "factory": "my_pkg.my_mod:load"}   # or any importable factory

The factory is called as ``factory(folder, **kwargs)`` and must return an object implementing
:class:`~wmrl.embodied.policy.VLAPolicy` (``reset()`` and ``act(observation, instruction)``).
A policy's ``save(folder)`` writes this file next to its weights, so ``wmrl eval libero --policy
FOLDER`` can rebuild it. Types that ship with WMRL are registered in :data:`POLICY_TYPES` as
``"module:function"`` strings (imported only when used); add one line there for a new type, or
call :func:`register_policy_type` at run time.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "BUILTIN_SPECS",
    "POLICY_FILE",
    "POLICY_TYPES",
    "load_policy",
    "policy_description",
    "register_policy_type",
]

POLICY_FILE = "policy.json"

BUILTIN_SPECS = frozenset({"random", "scripted"})
"""Policies named instead of loaded from a folder: the random floor and the scripted expert."""

POLICY_TYPES: dict[str, str | Callable[..., Any]] = {
    "random": "wmrl.embodied.policy.random_policy:load_random_policy",
    # the privileged scripted expert (no weights): also the spec "scripted"
    "scripted": "wmrl.embodied.policy.scripted_expert:load_scripted_policy",
    # a MiniVLAPolicy.save folder or a Prismatic/openvla-mini run directory
    "minivla": "wmrl.embodied.policy.minivla_policy:load_minivla",
}

_SPEC_KEYS = frozenset({"type", "factory", "kwargs"})


def register_policy_type(name: str, factory: str | Callable[..., Any]) -> None:
    """Make ``{"type": name}`` folders load with ``factory(folder, **kwargs)``."""
    if not name or not isinstance(name, str):
        raise ValueError(f"a policy type name must be a non-empty string; got {name!r}")
    POLICY_TYPES[name] = factory


def _resolve(factory: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(factory):
        return factory
    module_name, sep, attr = factory.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a policy factory must be written 'package.module:function'; got {factory!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"policy factory {factory!r} is not callable")
    return target


def _read_spec(folder: Path) -> dict[str, Any]:
    path = folder / POLICY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a saved policy: {POLICY_FILE} is missing")
    spec = json.loads(path.read_text())
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError(f"{path} must be a JSON object with a string 'type'")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(f"unknown keys in {path}: {sorted(unknown)}; allowed: {sorted(_SPEC_KEYS)}")
    if not isinstance(spec.get("kwargs", {}), dict):
        raise ValueError(f"'kwargs' in {path} must be a JSON object")
    return spec


def load_policy(spec: str | Path, **overrides: Any) -> Any:
    """Load a policy from ``"random"`` or a saved-policy folder.

    Args:
        spec: ``"random"`` (a :class:`~wmrl.embodied.policy.RandomPolicy`), ``"scripted"`` (the
            privileged :class:`~wmrl.embodied.policy.scripted_expert.ScriptedExpert`) or a folder
            with ``policy.json``.
        **overrides: keyword arguments merged over the folder's ``kwargs`` (e.g. ``seed``).
    """
    if str(spec) in BUILTIN_SPECS:
        return _resolve(POLICY_TYPES[str(spec)])(None, **overrides)
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"--policy must be 'random', 'scripted' or a saved-policy folder; {folder} is not a folder"
        )
    meta = _read_spec(folder)
    factory = meta.get("factory") or POLICY_TYPES.get(meta["type"])
    if factory is None:
        known = ", ".join(sorted(POLICY_TYPES))
        raise ValueError(
            f"unknown policy type {meta['type']!r} in {folder / POLICY_FILE}; known types: {known} (or give 'factory')"
        )
    policy = _resolve(factory)(folder, **{**meta.get("kwargs", {}), **overrides})
    for method in ("reset", "act"):
        if not callable(getattr(policy, method, None)):
            raise TypeError(f"the policy loaded from {folder} has no {method}() method")
    return policy


def policy_description(spec: str | Path) -> dict[str, Any]:
    """What the report records about the policy: the spec, and the folder's policy.json if any."""
    if str(spec) in BUILTIN_SPECS:
        return {"spec": str(spec), "type": str(spec)}
    folder = Path(spec).expanduser()
    meta = _read_spec(folder)
    return {"spec": str(folder.resolve()), "type": meta["type"], "policy_json": meta}
