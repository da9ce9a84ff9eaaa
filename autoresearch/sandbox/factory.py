"""``make_sandbox``: pick and build a backend by name, or the best one available."""

from __future__ import annotations

import inspect
import logging

from .base import Sandbox
from .bwrap import BwrapSandbox, bwrap_problem
from .docker_backend import DockerSandbox, docker_problem
from .local import SubprocessSandbox

__all__ = ["BACKENDS", "backend_problems", "make_sandbox"]

log = logging.getLogger("wmrl.autoresearch.sandbox")

BACKENDS: dict[str, type[Sandbox]] = {
    "bwrap": BwrapSandbox,
    "docker": DockerSandbox,
    "subprocess": SubprocessSandbox,
}


def backend_problems() -> dict[str, str | None]:
    """Backend name -> ``None`` when it can run here, else why not."""
    return {"bwrap": bwrap_problem(), "docker": docker_problem(), "subprocess": None}


def _accepted(cls: type[Sandbox], options: dict) -> dict:
    params = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in options.items() if k in params}


def make_sandbox(backend: str = "auto", **options) -> Sandbox:
    """Build a sandbox.

    Args:
        backend: ``"bwrap"``, ``"docker"``, ``"subprocess"``, or ``"auto"``: bubblewrap where it
            can create namespaces, else Docker where an engine answers, else subprocess with a
            logged warning that nothing is isolated (every result also says ``isolated=False``).
        options: keyword arguments of the backend class (``output_root``, ``cgroups``,
            ``hidden_paths``, ``image``...). With ``"auto"``, options that the chosen backend does
            not take are dropped; an option no backend takes raises ``TypeError``.

    An explicitly named backend that cannot run here (bwrap missing, no Docker engine) is still
    built: each of its results is a ``harness_error`` naming the problem (``sandbox.problem``).
    """
    if backend not in (*BACKENDS, "auto"):
        raise ValueError(f"backend must be one of {[*BACKENDS, 'auto']}; got {backend!r}")
    known = set()
    for cls in BACKENDS.values():
        known |= set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"make_sandbox got options no backend takes: {unknown}")
    if backend == "auto":
        problems = {"bwrap": bwrap_problem()}
        if problems["bwrap"] is None:
            backend = "bwrap"
        else:
            problems["docker"] = docker_problem()
            if problems["docker"] is None:
                backend = "docker"
            else:
                log.warning(
                    "no isolating sandbox backend is available (bwrap: %s; docker: %s); falling back to the "
                    "subprocess backend, which does NOT isolate untrusted code",
                    problems["bwrap"],
                    problems["docker"],
                )
                backend = "subprocess"
        options = _accepted(BACKENDS[backend], options)
    cls = BACKENDS[backend]
    extra = sorted(set(options) - set(inspect.signature(cls.__init__).parameters))
    if extra:
        raise TypeError(f"backend {backend!r} does not take options {extra}")
    sandbox = cls(**options)
    if sandbox.problem:
        log.warning("sandbox backend %s cannot run here: %s", backend, sandbox.problem)
    return sandbox
