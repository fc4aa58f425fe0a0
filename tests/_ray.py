"""What the Ray host's tests share: the skip mark, the settings, and the session's
Ray cluster (`RaySession`, the ``ray_session`` fixture of conftest.py).

The session's Ray is a local multi-node `ray.cluster_utils.Cluster` in this
machine: a head node (where this process, the facade, runs) and two worker nodes,
one CPU each (the actors take none). Worker node ``store`` advertises the resource
`STORE_RESOURCE`: a durable database opened with
``ray_store_resource=STORE_RESOURCE`` places its ledger shards there
(`runtime.ray_placement`), and `RaySession.replace_store_node` takes that node away
and adds another with the same resource (every node of this machine sees the same
disk). The head's health checks are tightened so a node that dies without saying so
is noticed within about 5 s (Ray's default is about 30 s).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Any

import pytest

from tidal_actors import Config

from .conftest import SEC

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAS_RAY, reason="Ray is not installed: pip install -e '.[ray]' (the ray extra)"
)

MAY_RETRY = re.compile(r"may have been applied|nothing of it was committed")
"""What a call interrupted by an actor's restart fails with: either it may have been
applied (`runtime.ray_faults`), or nothing of it was committed and it can be requested
again (`actors.coordinator`, `actors.coordinator_recovery`)."""

STORE_RESOURCE = "tidal_store"
"""The custom resource of the session's node(s) that hold durable ledgers."""

HEALTH_CHECKS = {  # the head notices a node that died unannounced in about 5 s
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 5,
}


def _address_file(restore: Any = False) -> str | None:
    """The content of Ray's "latest cluster on this machine" file (/tmp/ray/
    ray_current_cluster: a bare ``ray.init()`` of any program joins it), or None;
    given ``restore`` (a content or None), put that back first. `Cluster` writes
    its address there and removes the file at shutdown: on a machine where other
    programs use Ray, neither is for it to do."""
    import os

    from ray._common.utils import get_ray_address_file

    path = get_ray_address_file(None)
    if restore is not False:
        if restore is None:
            if os.path.exists(path):
                os.remove(path)
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(restore)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def ray_config(**changes: Any) -> Config:
    base = Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        rematerialize_after_ms=None,
        host="ray",
    )
    return base.replace(**changes)


@dataclass
class RaySession:
    """The session's cluster (see the module); ``cluster`` is None when this process
    was connected to Ray before the session (then it is used as it is)."""

    cluster: Any
    store: Any  # the worker node advertising STORE_RESOURCE
    replaced: int = 0  # store nodes replaced so far

    @classmethod
    def start(cls) -> RaySession:
        import ray
        from ray.cluster_utils import Cluster

        from tidal_actors.runtime.ray_replies import NAMESPACE

        if ray.is_initialized():
            return cls(None, None)
        before = _address_file()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "_system_config": HEALTH_CHECKS,
            },
        )
        store = cluster.add_node(num_cpus=1, resources={STORE_RESOURCE: 1})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        _address_file(before)  # Cluster wrote its address there: other programs' is kept
        ray.init(
            address=cluster.address,
            namespace=NAMESPACE,
            log_to_driver=False,
            configure_logging=False,
        )
        return cls(cluster, store)

    def stop(self) -> None:
        import ray

        if self.cluster is not None:
            before = _address_file()
            ray.shutdown()
            self.cluster.shutdown()
            _address_file(before)  # shutdown() removed the file, which is not ours

    def node_ids(self) -> dict[str, str]:
        """``head``, ``store`` -> the node's id (hex)."""
        return {"head": self.cluster.head_node.node_id, "store": self.store.node_id}

    def remove_store_node(self, graceful: bool) -> None:
        """Take the store node away: ``graceful`` its processes are told to end,
        else they are killed (SIGKILL: the node's death is noticed by the head's
        health checks)."""
        self.cluster.remove_node(self.store, allow_graceful=graceful)
        self.store = None

    def add_store_node(self) -> str:
        """Add a node advertising STORE_RESOURCE (the replacement); its id."""
        self.store = self.cluster.add_node(num_cpus=1, resources={STORE_RESOURCE: 1})
        self.replaced += 1
        return str(self.store.node_id)
