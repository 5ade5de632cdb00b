"""Built-in tasks: determinism by seed, split separation, formats, and reachability."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from asyncrl.data.tasks import TASKS, make_task


@pytest.mark.parametrize("task", sorted(TASKS))
def test_deterministic_by_seed_and_split(task: str) -> None:
    assert make_task(task, 30, seed=4) == make_task(task, 30, seed=4)
    assert make_task(task, 30, seed=4) != make_task(task, 30, seed=5)
    assert make_task(task, 30, seed=4, split="test") != make_task(task, 30, seed=4)


@pytest.mark.parametrize("task", ["arithmetic", "countdown", "code", "long_addition"])
def test_train_and_test_prompts_are_disjoint(task: str) -> None:
    def prompts(split: str) -> set[str]:
        return {r.messages[0]["content"] for r in make_task(task, 200, split=split)}

    assert not prompts("train") & prompts("test")


def test_unknown_task_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="arithmetic"):
        make_task("nope", 1)


def test_arithmetic_format_and_answer() -> None:
    rows = make_task("arithmetic", 100, ops=("+", "-"), low=0, high=9)
    ops_seen = set()
    for r in rows:
        m = re.fullmatch(r"What is (\d)([+-])(\d)\?", r.messages[0]["content"])
        assert m and r.messages[0]["role"] == "user" and r.data_source == "arithmetic"
        a, op, b = int(m[1]), m[2], int(m[3])
        assert r.ground_truth == str(a + b if op == "+" else a - b)
        ops_seen.add(op)
    assert ops_seen == {"+", "-"}
    assert all(r.messages[0]["content"].isascii() for r in rows)


def test_countdown_target_reachable_by_stored_solution() -> None:
    for r in make_task("countdown", 50, seed=2):
        truth = json.loads(r.ground_truth)
        assert 3 <= len(truth["numbers"]) <= 4 and r.data_source == "countdown"
        solution = r.extra_info["solution"]
        assert sorted(int(x) for x in re.findall(r"\d+", solution)) == sorted(truth["numbers"])
        assert eval(solution) == truth["target"]  # our own generated arithmetic, not model output


def test_code_tests_are_json_with_fn_name() -> None:
    for r in make_task("code", 20):
        truth = json.loads(r.ground_truth)
        assert truth["fn_name"] == "f" and len(truth["tests"]) == 5
        assert r.data_source == "code" and "def" not in r.messages[0]["content"]


def test_longtail_lengths_are_long_tailed_and_capped() -> None:
    rows = make_task("longtail", 2000, max_len=512)
    ks = [r.extra_info["length"] for r in rows]
    assert 24 <= statistics.median(ks) <= 40 and max(ks) <= 512 and max(ks) > 200
    r = rows[0]
    assert r.messages[0]["content"] == f"Repeat the letter a {ks[0]} times." and r.ground_truth == "a" * ks[0]


def test_long_addition_operands_have_the_asked_digits_and_the_truth_is_their_sum() -> None:
    rows = make_task("long_addition", 200, min_digits=6, max_digits=9)
    lengths = set()
    for r in rows:
        m = re.fullmatch(r"What is (\d+)\+(\d+)\?", r.messages[0]["content"])
        assert m and r.data_source == "long_addition" and r.ground_truth == str(int(m[1]) + int(m[2]))
        lengths |= {len(m[1]), len(m[2])}
        assert not m[1].startswith("0") and not m[2].startswith("0")
    assert lengths == {6, 7, 8, 9}
