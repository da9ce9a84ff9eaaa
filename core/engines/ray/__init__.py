"""Ray integration: a pool of workers on any node for real execution (needs ``ray``; extra ``distributed``).

* :class:`RayPool` (:mod:`.pool`): domain-neutral work items on Ray actors with resources, deadlines,
  retries on other nodes, and lost workers turned into :class:`Unknown` with the reason.
* :class:`RayPoolConfig` (:mod:`.config`): where and how (importable without Ray).
* :class:`LocalCluster` (:mod:`.cluster`): a real multi-node cluster on one machine, for tests and
  benchmarks.

Ray is imported when a pool or a cluster is used, not when this package is.
"""

from wmrl.core.engines.ray.cluster import LocalCluster, LocalNode
from wmrl.core.engines.ray.config import RayPoolConfig
from wmrl.core.engines.ray.pool import RayPool, Unknown, WorkerInfo

__all__ = ["LocalCluster", "LocalNode", "RayPool", "RayPoolConfig", "Unknown", "WorkerInfo"]
