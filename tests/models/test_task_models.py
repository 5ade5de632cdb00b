"""tiny-countdown and tiny-longtail: their own cache keys (tiny's unchanged), SFT examples from the
train split with their label noise, a tokenizer that holds every character of the tasks, and a
few-step build that the loader then finds in the cache; the real countdown warm-up learns to copy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from asyncrl.config.load import load_config
from asyncrl.config.schema import ModelConfig
from asyncrl.config.verl import TOY_MODELS
from asyncrl.data import make_task
from asyncrl.data.tasks.common import in_split
from asyncrl.models import loading
from asyncrl.models.task_models import COUNTDOWN, LONGTAIL, TASK_MODELS
from asyncrl.models.tiny import TinySpec
from asyncrl.models.tiny_task import FLIP, countdown_target, longtail_target, sft_pairs
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rewards.puzzles import countdown_score


def test_each_has_its_own_cache_key_and_tiny_keeps_its_own() -> None:
    assert TinySpec().key().startswith("tiny-")  # pinned in test_cache
    assert COUNTDOWN.key().startswith("tiny_countdown-") and LONGTAIL.key().startswith("tiny_longtail-")
    assert dataclasses.replace(COUNTDOWN, label_noise=0.4).key() != COUNTDOWN.key()
    assert dataclasses.replace(COUNTDOWN, options=()).key() != COUNTDOWN.key()  # the options are part of the model


def test_they_are_builtin_toys_that_keep_asyncrls_defaults() -> None:
    for name in TASK_MODELS:
        assert name in TOY_MODELS and name in loading.BUILTIN
        loading.check_model_path(name)  # no ConfigError: built on first use
        assert load_config(overrides=[f"model.path={name}"]).actor.lr == load_config().actor.lr


def test_run_overrides_give_the_task_and_its_options() -> None:
    cfg = load_config(overrides=COUNTDOWN.run_overrides())
    assert (cfg.model.path, cfg.data.task) == ("tiny-countdown", "countdown")
    assert cfg.data.task_options == ("counts=[2]", "max_number=9", "max_target=18", "ops=+-", "prompt=short")


@pytest.mark.parametrize("spec", [COUNTDOWN, LONGTAIL], ids=lambda s: s.name)
def test_sft_questions_are_the_train_split_and_the_tokenizer_knows_every_character(spec) -> None:
    pairs = sft_pairs(spec, 64, seed=3, label_noise=0.5)
    train = make_task(spec.task, 64, seed=3, split="train", **spec.task_options())
    assert [q for q, _ in pairs] == [r.messages[0]["content"] for r in train]
    tok = build_char_tokenizer()
    text = "".join(q + a for q, a in pairs)
    assert tok.unk_token_id not in tok.encode(text, add_special_tokens=False)


def test_countdown_puzzles_are_small_and_never_held_out() -> None:
    rows = make_task("countdown", 200, seed=1, split="train", **COUNTDOWN.task_options())
    for r in rows:
        truth = json.loads(r.ground_truth)
        assert len(truth["numbers"]) == 2 and max(truth["numbers"]) <= 9 and truth["target"] <= 18
        assert set(r.extra_info["solution"]) - set("0123456789") <= {"+", "-"}
        assert in_split(f"{sorted(truth['numbers'])}={truth['target']}", "train")


def test_countdown_targets_are_the_solution_or_a_well_formed_miss() -> None:
    pairs = sft_pairs(COUNTDOWN, 400, seed=5, label_noise=0.3)
    rows = make_task("countdown", 400, seed=5, split="train", **COUNTDOWN.task_options())
    exact = [countdown_score(a, r.ground_truth)["score"] for (_, a), r in zip(pairs, rows)]
    noisy = [s for s in exact if s < 1.0]
    assert 0.2 <= len(noisy) / len(exact) <= 0.4  # the noise share
    assert all(s == pytest.approx(0.1, rel=1e-12, abs=1e-12) for s in noisy)  # well formed, wrong value
    assert [a for _, a in sft_pairs(COUNTDOWN, 50, seed=5)] == [r.extra_info["solution"] for r in rows[:50]]


def test_a_perturbed_answer_flips_one_operation_or_moves_the_length_by_at_most_a_quarter() -> None:
    import random

    rng = random.Random(0)
    row = make_task("countdown", 1, seed=0, split="train", counts=(3,), ops="+-*")[0]
    solution = row.extra_info["solution"]
    for _ in range(20):
        flipped = countdown_target(row, rng)
        changed = [(a, b) for a, b in zip(solution, flipped) if a != b]
        assert len(flipped) == len(solution) and len(changed) == 1 and changed[0][1] == FLIP[changed[0][0]]
    long_row = make_task("longtail", 1, seed=0, split="train", median=40.0, sigma=0.0)[0]  # k = 40
    lengths = {len(longtail_target(long_row, rng)) for _ in range(200)}
    assert lengths <= set(range(30, 51)) - {40} and min(lengths) < 40 < max(lengths)
    assert set(longtail_target(long_row, rng)) == {"a"} and longtail_target(long_row, None) == "a" * 40


def test_a_few_step_build_is_cached_and_loaded_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-step warm-up stands in for the real one (about a minute): the loader builds it once under
    the spec's key, writes its report, then loads it from the cache and finds its tokenizer."""
    small = dataclasses.replace(LONGTAIL, warmup_max_steps=2, warmup_batch=4, probe_size=4, probe_from=2,
                                probe_every=2, max_new_tokens=4)
    monkeypatch.setenv("ASYNCRL_CACHE", str(tmp_path))
    monkeypatch.setitem(loading.TASK_MODELS, LONGTAIL.name, small)
    said: list[str] = []
    model, tok = loading.load_model(ModelConfig(path=LONGTAIL.name), said.append)
    report = json.loads((tmp_path / small.key() / "warmup.json").read_text())
    assert report["steps"] == 2 and 0.0 <= report["sampled_score"] <= 1.0
    assert any("warm-up step 2" in line for line in said)
    said.clear()
    loading.load_model(ModelConfig(path=LONGTAIL.name), said.append)
    assert said == []  # from the cache, no rebuild
    assert loading.local_tokenizer_dir(LONGTAIL.name) == tmp_path / small.key()
    assert model.config.vocab_size == len(tok) == len(build_char_tokenizer())


def test_the_countdown_warm_up_teaches_copying_and_leaves_room_for_rl(model_cache: Path) -> None:
    """The real tiny-countdown build (about 10 s on one core, then cached): greedy decoding reaches the
    spec's target score before its step limit, which needs the two numbers copied from the prompt,
    while sampled answers (where RL starts) stay far below."""
    loading.load_model(ModelConfig(path=COUNTDOWN.name), lambda _: None)
    report = json.loads((model_cache / COUNTDOWN.key() / "warmup.json").read_text())
    assert report["steps"] < COUNTDOWN.warmup_max_steps and report["greedy_score"] >= COUNTDOWN.target_score
    assert report["sampled_score"] < report["greedy_score"]
