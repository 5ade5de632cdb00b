"""bench/convergence.py's arithmetic: the parity verdict and the per-mode summary, on hand-made results."""

from __future__ import annotations

import pytest

from bench.convergence import (
    LEGACY_SETTINGS,
    curve,
    final_score,
    median_time,
    parity,
    parse,
    same_settings,
    settings,
    summarize,
)


def test_parity_docstring_example_and_the_other_verdicts() -> None:
    p = parity([0.01, -0.01, 0.0, 0.02, -0.02])
    # sd = sqrt(0.001 / 4) = 0.0158114; half-width = 2.776 x 0.0158114 / sqrt(5) = 0.0196293
    assert p["verdict"] == "not worse at 0.03"
    assert p["ci95"] == pytest.approx([-0.0196293, 0.0196293], rel=1e-5, abs=1e-7)
    assert parity([-0.05, -0.06, -0.04, -0.05, -0.055])["verdict"] == "below"
    assert parity([0.01, 0.0, 0.02])["verdict"] == "not shown"  # an interval above -0.03, but only 3 seeds
    assert parity([0.1, -0.1, 0.05, 0.0, -0.05])["verdict"] == "not shown"  # straddles -0.03


def test_curve_counts_trained_prompts_and_wall_time_with_validation() -> None:
    rows = [{"step": 0, "timing_s/testing": 1.0, "val/score/mean": 0.2, "val-core/a/reward/pass@4": 0.5,
             "val/response_length/mean": 12.5},
            {"step": 1, "timing_s/step": 2.0},
            {"step": 2, "timing_s/step": 3.0, "timing_s/testing": 1.0, "val/score/mean": 0.4}]
    # 8 prompts a step where unlogged; the second validation logged no length
    assert curve(rows, 8, 4) == [{"samples": 0, "wall_s": 1.0, "score": 0.2, "pass": 0.5, "length": 12.5},
                                 {"samples": 16, "wall_s": 7.0, "score": 0.4, "pass": None, "length": None}]
    paced = [{"timing_s/step": 1.0, "training/responses": 64}, {"timing_s/step": 1.0, "training/responses": 128},
             {"val/score/mean": 0.5}]  # an update that trained 32 prompts' groups, not R = 16
    assert curve(paced, 16, 4)[0]["samples"] == 48


def result(mode: str, seed: int, scores: list[float], walls: list[float]) -> dict:
    points = [{"samples": 16 * i, "wall_s": w, "score": s, "pass": None} for i, (s, w) in enumerate(zip(scores, walls))]
    return {"mode": mode, "task": "arithmetic", "seed": seed, "points": points, "samples_per_s": 10.0}


def test_summary_time_to_ninety_percent_and_paired_parity() -> None:
    # the final score is the mean of the last three validations (here all equal)
    results = [result("colocated", s, [0.1, 0.5, 0.6, 0.6, 0.6], [0, 10, 20, 30, 40]) for s in range(5)]
    results += [result("fa_partial", s, [0.1, 0.55] + [0.6 - 0.01 * s] * 3, [0, 4, 8, 12, 16]) for s in range(5)]
    summary = summarize(results)["arithmetic"]
    # target 0.9 x 0.6 = 0.54: colocated reaches it at its last validation (20 s), fa_partial at 4 s
    assert summary["colocated"]["time_to_90pct_s"] == 20 and summary["fa_partial"]["time_to_90pct_s"] == 4
    fa = summary["fa_partial"]
    assert fa["status"] == "exploratory"
    # the table's columns subtract to the paired difference: 0.58 - colocated's 0.6 on the same seeds
    assert fa["reference_paired_mean"] - fa["final_mean"] == pytest.approx(0.02, rel=1e-9, abs=1e-12)
    assert (median_time([10.0, None, 30.0]), median_time([10.0, None]), median_time([])) == (30.0, None, None)
    assert fa["final_mean"] == pytest.approx(0.58, rel=1e-12, abs=1e-12)
    # paired diffs 0, -0.01, -0.02, -0.03, -0.04: mean -0.02, half-width 0.0196293 -> [-0.0396, -0.0004],
    # which straddles -0.03: not shown (five seeds are not enough to call it either way)
    assert fa["parity"]["ci95"] == pytest.approx([-0.0396293, -0.0003707], rel=1e-4, abs=1e-7)
    assert fa["parity"]["verdict"] == "not shown"
    # averaged over all five validations (a whole plateau), the first ones' lower scores count too
    assert summarize(results, last=5)["arithmetic"]["fa_partial"]["final_mean"] == pytest.approx(
        (0.1 + 0.55 + 3 * 0.58) / 5, rel=1e-12)


def test_final_score_is_the_mean_of_the_last_three_validations() -> None:
    points = [{"score": v} for v in (0.2, 0.3, 0.35, 0.3, 0.31)]
    assert final_score(points) == pytest.approx(0.32, rel=1e-12)
    assert final_score(points[:2]) == pytest.approx(0.25, rel=1e-12)  # fewer validations: all of them


def test_a_cell_knows_whether_partial_rollout_was_on() -> None:
    from bench.convergence import overrides, partial_rollout

    args = parse([])
    assert partial_rollout(overrides("fa_partial", "longtail_partial", 0, args))
    assert not partial_rollout(overrides("fa_stale", "longtail_partial", 0, args))
    assert not partial_rollout(["async_training.partial_rollout=true", "async_training.partial_rollout=false"])


def test_cells_are_reused_only_under_the_same_settings() -> None:
    legacy = {"mode": "colocated", "task": "arithmetic", "seed": 0}  # written before cells kept settings
    longer = parse(["--steps", "120"])
    newer = {**legacy, "settings": settings(longer)}
    assert settings(parse([])).keys() == LEGACY_SETTINGS.keys()
    assert same_settings([legacy, newer], longer) == [newer]
    assert same_settings([legacy, newer], parse(["--steps", "60", "--lr", "2e-4"])) == [legacy]


def test_each_task_runs_on_its_model_with_its_options() -> None:
    """arithmetic keeps the keys of the cells already in the results (tiny, the defaults); countdown
    and longtail run on the model warmed up on each, with the task options it knows, and their
    validation prompts all fit."""
    from asyncrl.config.load import load_config
    from asyncrl.data import make_task
    from asyncrl.data.held_out import val_rows
    from asyncrl.data.tasks import task_rows
    from asyncrl.models.task_models import TASK_MODELS
    from asyncrl.models.tokenizer import build_char_tokenizer
    from bench.convergence import overrides, parse

    args = parse(["--tasks", "arithmetic,countdown,longtail"])
    arithmetic = overrides("colocated", "arithmetic", 0, args)
    assert "data.task=arithmetic" in arithmetic
    assert not any(k.startswith(("model.", "data.task_options")) for k in arithmetic)
    for spec in TASK_MODELS.values():
        cfg = load_config(overrides=overrides("fa_partial", spec.task, 1, args))
        assert (cfg.model.path, cfg.data.task) == (spec.name, spec.task)
        assert task_rows(cfg.data, 8, seed=1, split="test") == make_task(spec.task, 8, seed=1, split="test",
                                                                         **spec.task_options())
        dropped: list[str] = []
        assert len(val_rows(cfg.data, 1, build_char_tokenizer(), dropped.append)[0]) == args.val_size
        assert dropped == []
    partial = load_config(overrides=overrides("fa_partial", "longtail_partial", 0, args))  # issue 38: long answers
    assert (partial.model.path, partial.data.task_options[0]) == ("tiny-longtail", "median=150.0")
    assert len(val_rows(partial.data, 1, build_char_tokenizer(), dropped.append)[0]) == args.val_size
    assert dropped == []
    with pytest.raises(SystemExit):
        parse(["--tasks", "arithmetic,countdwn"])


def test_the_pretrained_task_validates_greedy_on_held_out_additions() -> None:
    """smollm2_addition: SmolLM2 on arithmetic up to 49+49, one greedy response per held-out problem
    (the task's keys come after the shared rollout.val_n=4), sampled at 0.7, and --override still wins."""
    from asyncrl.config.load import load_config
    from bench.convergence import overrides, parse

    args = parse(["--tasks", "smollm2_addition", "--val-size", "500", "--override", "data.max_response_length=48"])
    cfg = load_config(overrides=overrides("fa_stale", "smollm2_addition", 0, args))
    assert (cfg.model.path, cfg.data.task, cfg.data.task_options) == ("smollm2-135m-instruct", "arithmetic",
                                                                     ("high=49",))
    assert (cfg.rollout.val_n, cfg.rollout.val_temperature, cfg.rollout.temperature) == (1, 0.0, 0.7)
    assert (cfg.data.val_size, cfg.data.max_response_length) == (500, 48)
