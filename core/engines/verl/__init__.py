"""verl integration (needs ``verl``; extra ``verl``, its own environment: ``.venv-verl``).

verl finds the plug-in through the ``verl.plugins`` entry point (:mod:`.plugin`), which registers
the ``wmrl`` reward manager (:mod:`.reward`: the world model scores every sample in verl's reward
loop), the ``wmrl`` advantage estimator (:mod:`.advantage`: the corrector's advantages, unknowns
masked) and the ``wmrl_sync`` trainer (:mod:`.trainer`: plans anchors per batch, executes them,
corrects, checkpoints the correction with verl's checkpoints). :mod:`.workers` runs the world model
as a verl worker group, one per GPU. What a run names is in :class:`~.config.VerlConfig`.
:mod:`.cpu_platform` (loaded only when named: ``VERL_USE_EXTERNAL_MODULES``) runs a whole verl step
on a CPU-only machine, for tests.

Importing this package does not import verl; its modules do.
"""

from wmrl.core.engines.verl.config import ENV_VAR, VerlConfig, load_object

__all__ = ["ENV_VAR", "VerlConfig", "load_object"]
