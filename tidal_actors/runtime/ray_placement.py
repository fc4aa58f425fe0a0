"""Where the Ray host places each actor of a database (`placement`), for
`runtime.ray_host`.

* An ephemeral database: nothing ties its actors to a node, so Ray spreads them
  over the cluster's nodes (``"SPREAD"``).
* A durable database: every actor's process opens the database's one LMDB
  environment (`runtime.ray_stores`), so each must run where that directory is.
  By default all of them run on the facade's node (a hard node affinity). With
  ``Config.ray_store_resource`` naming a custom Ray resource, the ledger shards
  (the actors that restart in place, `runtime.ray_restart`) are placed on a node
  advertising it instead, each taking `STORE_SHARE` of it, and Ray restarts them on
  such a node when theirs dies (a replacement node started with the same resource
  takes them). The membership shards, the coordinator and persistence stay on the
  facade's node: nothing restarts them yet, so a node loss must not take them.

Every node advertising the resource must see the directory at the same path with
LMDB's locking working across the processes (one machine's disk: LMDB's lock file
does not work over a network file system).
"""

from __future__ import annotations

from typing import Any

import ray

from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument
from tidal_actors.actors import messages as M

__all__ = ["STORE_SHARE", "check_store_resource", "placement"]

STORE_SHARE = 0.001
"""How much of ``Config.ray_store_resource`` each ledger actor takes (so a node
advertising 1 of it holds up to 1,000 ledger actors)."""


def placement(config: Config, address: M.Address, durable: bool) -> dict[str, Any]:
    """The Ray actor options that place ``address``'s actor (see the module)."""
    if not durable:
        return {"scheduling_strategy": "SPREAD"}
    resource = config.ray_store_resource
    if resource is not None and address[0] == M.LEDGER:
        return {"resources": {resource: STORE_SHARE}}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def check_store_resource(config: Config) -> None:
    """Refuse a ``ray_store_resource`` no live node of the cluster advertises (its
    ledger actors would wait for such a node).

    Raises:
        InvalidArgument: naming ``ray_store_resource`` and the value.
    """
    resource = config.ray_store_resource
    if resource is not None and ray.cluster_resources().get(resource, 0) <= 0:  # type: ignore[no-untyped-call]
        raise InvalidArgument(
            "ray_store_resource",
            resource,
            "no node of the Ray cluster advertises this resource: start the nodes that "
            "see the store's directory with --resources='{\"" + resource + "\": 1}'",
        )
