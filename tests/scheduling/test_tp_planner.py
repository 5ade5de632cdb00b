"""The parallelism planner against hand-computed TP sequences (integers: compared exactly)."""

from __future__ import annotations

import pytest

from asyncrl.scheduling.tp_planner import TPPlanner


def run(planner: TPPlanner, preemptions: list[int]) -> list[int]:
    return [planner.step(p) for p in preemptions]


def test_docstring_example():
    planner = TPPlanner(1, growth=1.05, calm_steps=2, max_tp=8, gpus_per_node=4)
    assert run(planner, [0, 3, 3, 4, 10, 0, 0, 0, 0]) == [1, 2, 2, 4, 4, 4, 2, 2, 1]


def test_first_step_with_preemptions_doubles_and_without_counts_as_calm():
    assert TPPlanner(2).step(1) == 4  # 1 > 1.05 x 0 (nothing before the run)
    planner = TPPlanner(2, calm_steps=1)
    assert planner.step(0) == 1  # one calm step is enough here


@pytest.mark.parametrize("previous, now, tp", [(20, 21, 1), (20, 22, 2), (0, 0, 1), (5, 0, 1), (100, 3, 1)])
def test_jump_means_more_than_growth_times_the_previous_step(previous, now, tp):
    planner = TPPlanner(1, growth=1.05)
    planner.previous = previous  # 1.05 x 20 = 21: 21 is no jump, 22 is
    assert planner.step(now) == tp


def test_steady_preemptions_do_not_keep_doubling():
    assert run(TPPlanner(1), [8, 8, 8, 8, 8, 8]) == [2, 2, 2, 2, 2, 2]


@pytest.mark.parametrize("max_tp, gpus_per_node, top", [(8, 0, 8), (4, 8, 4), (8, 2, 2), (8, 6, 2), (16, 16, 16)])
def test_doubling_stops_at_max_tp_and_at_sizes_that_tile_a_node(max_tp, gpus_per_node, top):
    planner = TPPlanner(1, growth=1.05, max_tp=max_tp, gpus_per_node=gpus_per_node)
    assert run(planner, [1, 2, 4, 8, 16, 32])[-1] == top  # every step a jump


def test_halving_resets_the_calm_count_and_stops_at_one():
    planner = TPPlanner(8, calm_steps=3)
    assert run(planner, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]) == [8, 8, 4, 4, 4, 2, 2, 2, 1, 1, 1, 1]
    assert planner.calm == 0  # step 12 was the third calm step since the halving at step 9


def test_a_preemption_breaks_the_calm_run():
    planner = TPPlanner(4, growth=1.05, calm_steps=2)
    # step 2: 5 > 0, a jump: 4 -> 8; step 3: calm 1; step 4: 3 > 1.05 x 0 (step 3 had none), a
    # jump, but 16 > max_tp 8: stays 8, and the calm run restarts; steps 5-6 calm: halve to 4
    assert run(planner, [0, 5, 0, 3, 0, 0]) == [4, 8, 8, 8, 8, 4]


def test_halving_stops_at_min_tp():
    p = TPPlanner(2, calm_steps=1, min_tp=2)
    assert [p.step(0) for _ in range(3)] == [2, 2, 2]
    assert p.step(5) == 4 and p.step(0) == 2 and p.step(0) == 2
