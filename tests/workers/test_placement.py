"""A pool no node of the cluster can host is named by the key that asks too much, before Ray waits."""

from __future__ import annotations

from asyncrl.workers.placement import PoolRequest, unplaceable

NODES = [{"CPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}]


def pool(nnodes: int = 1, cpus: float = 1, gpus: float = 0) -> PoolRequest:
    return PoolRequest("rollout", nnodes, cpus, gpus, "rollout.num_cpus", "rollout.n_gpus_per_node", "rollout.nnodes")


def test_docstring_example() -> None:
    assert unplaceable(pool(cpus=64), NODES) == (
        "rollout.num_cpus=64 asks one node of the Ray cluster for 64 CPUs for the rollout pool, but its largest node "
        "has 8: lower rollout.num_cpus, or add larger nodes")


def test_each_part_of_the_ask_is_named_by_its_key() -> None:
    assert unplaceable(pool(nnodes=2, cpus=16), NODES).startswith("rollout.num_cpus=32 (32 over 2 nodes) asks")
    assert unplaceable(pool(gpus=2), NODES).startswith("rollout.n_gpus_per_node=2 asks one node")
    assert unplaceable(pool(nnodes=2, cpus=4), NODES).startswith(
        "rollout.nnodes=2 asks for 2 nodes of 4 CPUs and 0 GPUs each for the rollout pool, but the Ray cluster has 1")
    assert unplaceable(pool(nnodes=2, cpus=2), NODES) is None  # fits: one bundle on each node
    assert unplaceable(pool(cpus=8, gpus=1), NODES) is None
