"""Whether a resource pool can ever be placed on a Ray cluster, decided before asking Ray.

A placement group that no node can host waits for Ray's full timeout (minutes) and then fails
naming nothing the user set. `unplaceable(pool, nodes)` compares one pool's bundle (one per node:
CPUs, GPUs) with the resources each alive node has in all, and names the key that asks too much:
more CPUs or GPUs per node than the largest node has, or more nodes than the cluster has nodes
big enough. A pool that fits but waits for busy nodes is not refused here.

Pure: node totals in, a one-line message (or None) out; `asyncrl.workers.ray_host` calls it with
`ray.nodes()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolRequest:
    """One pool's ask and the config keys behind each part of it."""

    name: str
    nnodes: int
    cpus_per_node: float
    gpus_per_node: float
    cpus_key: str
    gpus_key: str
    nodes_key: str


def unplaceable(pool: PoolRequest, nodes: Sequence[Mapping[str, float]]) -> str | None:
    """The reason no placement of `pool` exists on nodes with these total resources, else None.

    Example: a pool asking 1 node x 64 CPUs (key rollout.num_cpus) on nodes of 2 and 8 CPUs ->
    "rollout.num_cpus=64 asks one node of the Ray cluster for 64 CPUs for the rollout pool, but its
    largest node has 8: lower rollout.num_cpus, or add larger nodes"."""
    most_cpus = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    most_gpus = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    if pool.cpus_per_node > most_cpus:
        return _too_big(pool, pool.cpus_key, pool.cpus_per_node * pool.nnodes, pool.cpus_per_node, "CPUs", most_cpus)
    if pool.gpus_per_node > most_gpus:
        return _too_big(pool, pool.gpus_key, pool.gpus_per_node, pool.gpus_per_node, "GPUs", most_gpus)
    fitting = sum(n.get("CPU", 0.0) >= pool.cpus_per_node and n.get("GPU", 0.0) >= pool.gpus_per_node for n in nodes)
    if pool.nnodes > fitting:
        return (f"{pool.nodes_key}={pool.nnodes} asks for {pool.nnodes} nodes of {pool.cpus_per_node:g} CPUs and "
                f"{pool.gpus_per_node:g} GPUs each for the {pool.name} pool, but the Ray cluster has {fitting} such "
                f"node(s): lower {pool.nodes_key}, or add nodes")
    return None


def _too_big(pool: PoolRequest, key: str, value: float, per_node: float, what: str, largest: float) -> str:
    per = "" if pool.nnodes == 1 else f" ({value:g} over {pool.nnodes} nodes)"
    return (f"{key}={value:g}{per} asks one node of the Ray cluster for {per_node:g} {what} for the {pool.name} "
            f"pool, but its largest node has {largest:g}: lower {key}, or add larger nodes")
