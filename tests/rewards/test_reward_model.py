"""The learned reward model: a tiny sequence classifier fitted here to a rule ("the answer ends in
an even digit"), scoring as batched as one at a time, reading text re-templated with its own
tokenizer, one-line errors naming the key, combined with the rule reward in the reward worker,
and (slow) a policy trained on it alone whose rule score rises."""

from __future__ import annotations

import dataclasses
import random
import string
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from asyncrl.config import load_config
from asyncrl.config.schema import RewardConfig, RolloutConfig
from asyncrl.errors import ConfigError
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rewards import RewardResult
from asyncrl.rewards.reward_model import check_reward_model_path, combine
from asyncrl.training.reward_model import RewardModel
from asyncrl.types import Group, PromptRow, Trajectory
from asyncrl.workers.reward import RewardWorker

PLAIN_TEMPLATE = ("{% for m in messages %}{% if not loop.first %}\n{% endif %}{{ m['content'] }}{% endfor %}"
                  "{% if add_generation_prompt %}\n{% endif %}")
"""The reward model's own chat template: turns joined by newlines, no end marker, so its last token
(where the classifier reads its score) is the response's last character."""


def rule(response: str) -> float:
    """What the test's reward model learns: 1 when the response ends in an even digit."""
    return float(response[-1:] in tuple("02468"))


def rm_tokenizer(template: str = PLAIN_TEMPLATE) -> PreTrainedTokenizerFast:
    tok = build_char_tokenizer()
    tok.chat_template = template
    return tok


def classifier(tok: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForSequenceClassification:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                         pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=tok.eos_token_id)
    config.num_labels = 1  # one score per response
    return LlamaForSequenceClassification(config)


def responses(n: int, seed: int) -> list[tuple[str, str]]:
    """(question, response) pairs like the tiny policy's: numbers near the sum, some junk."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 19), rng.randint(0, 19)
        answer = str(max(a + b + rng.randint(-3, 3), 0)) if rng.random() < 0.85 else \
            "".join(rng.choice(string.digits + string.ascii_lowercase + " ?+=") for _ in range(rng.randint(0, 4)))
        out.append((f"What is {a}+{b}?", answer))
    return out


def encode(tok: PreTrainedTokenizerFast, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    texts = [tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": r}],
                                     tokenize=False) for q, r in pairs]
    return dict(tok(texts, return_tensors="pt", padding=True, add_special_tokens=False))


def fit_rule_model(out: Path, steps: int = 60) -> float:
    """Fit a tiny classifier to `rule` (logistic loss, full batch), save it with its tokenizer in
    `out`; its accuracy on held-out responses."""
    tok = rm_tokenizer()
    model = classifier(tok)
    train = responses(512, seed=1)
    batch, labels = encode(tok, train), torch.tensor([rule(r) for _, r in train])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(**batch).logits[:, 0], labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    held_out = responses(256, seed=2)
    with torch.no_grad():
        scores = model.eval()(**encode(tok, held_out)).logits[:, 0]
    accuracy = float(((scores > 0).float() == torch.tensor([rule(r) for _, r in held_out])).float().mean())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return accuracy


@pytest.fixture(scope="module")
def rule_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("rule-rm")
    return out, fit_rule_model(out)


def row_and_trajectory(tok: PreTrainedTokenizerFast, question: str, response: str, i: int = 0
                       ) -> tuple[PromptRow, Trajectory]:
    messages = ({"role": "user", "content": question},)
    prompt = tuple(tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)["input_ids"])  # type: ignore[call-overload, index]
    row = PromptRow(uid=f"p{i}", data_source="arithmetic", messages=messages, ground_truth="0", prompt_ids=prompt)
    ids = tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]
    return row, Trajectory(f"p{i}/0", prompt, ids, [0.0] * len(ids), [0] * len(ids), "stop")


def test_a_classifier_fitted_to_the_rule_scores_it(rule_model: tuple[Path, float]) -> None:
    path, accuracy = rule_model
    assert accuracy >= 0.95
    policy = build_char_tokenizer()
    rm = RewardModel.load(RewardConfig(model_path=str(path)), policy)
    assert rm.retemplate  # its chat template differs from the policy's
    pairs = [("What is 3+4?", "8"), ("What is 3+4?", "7"), ("What is 9+9?", "18"), ("What is 9+9?", "x")]
    rows, trajs = zip(*(row_and_trajectory(policy, q, r, i) for i, (q, r) in enumerate(pairs)))
    scores = rm.score(rows, trajs, [r for _, r in pairs])
    assert [s > 0 for s in scores] == [True, False, True, False]


def test_batched_scores_equal_one_at_a_time(tmp_path: Path) -> None:
    tok = build_char_tokenizer()  # the policy's own tokenizer: the trajectory's ids are read as they are
    classifier(tok, seed=3).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    pairs = responses(7, seed=4)
    rows, trajs = zip(*(row_and_trajectory(tok, q, r, i) for i, (q, r) in enumerate(pairs)))
    texts = [r for _, r in pairs]
    one = RewardModel.load(RewardConfig(model_path=str(tmp_path), model_batch_size=1), tok)
    three = RewardModel.load(RewardConfig(model_path=str(tmp_path), model_batch_size=3), tok)
    assert not one.retemplate and one.input_ids(rows[0], trajs[0], texts[0]) == [*trajs[0].prompt_ids,
                                                                                  *trajs[0].response_ids]
    assert len({len(t.prompt_ids) + len(t.response_ids) for t in trajs}) > 1  # the batches pad
    assert three.score(rows, trajs, texts) == pytest.approx(one.score(rows, trajs, texts), rel=1e-5, abs=1e-6)


def test_a_different_tokenizer_reads_the_text_in_its_own_template(tmp_path: Path) -> None:
    policy, own = build_char_tokenizer(), rm_tokenizer("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }};"
                                                       "{% endfor %}")
    model = classifier(own, seed=5)
    model.save_pretrained(tmp_path)
    own.save_pretrained(tmp_path)
    rm = RewardModel.load(RewardConfig(model_path=str(tmp_path), model_max_length=20), policy)
    row, traj = row_and_trajectory(policy, "What is 2+2?", "4")
    ids = rm.input_ids(row, traj, "4")
    assert own.decode(ids) == "user: What is 2+2?;assistant: 4;"[-20:]  # the last model_max_length tokens
    with torch.no_grad():
        expected = model.eval()(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert rm.score([row], [traj], ["4"]) == pytest.approx([expected], rel=1e-5, abs=1e-6)


def test_a_path_that_is_not_a_sequence_classifier_is_one_line_naming_the_key(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32)).save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    for path, says in [(tmp_path / "missing", "does not exist"), (tmp_path / "lm", "LlamaForCausalLM")]:
        with pytest.raises(ConfigError) as err:
            RewardModel.load(RewardConfig(model_path=str(path)), tok)
        message = str(err.value)
        assert message.startswith(f"reward.model_path='{path}'") and says in message and "\n" not in message
    two = classifier(tok)
    two.config.num_labels = 2
    two.save_pretrained(tmp_path / "two")
    tok.save_pretrained(tmp_path / "two")
    with pytest.raises(ConfigError, match=r"^reward.model_path=.* has 2 labels"):
        check_reward_model_path(str(tmp_path / "two"))


def test_combine_weights_the_rule_and_the_model() -> None:
    both = combine(RewardResult(1.0, details={"format": 1.0}), 0.5, rule_weight=1.0, model_weight=2.0)
    assert both.score == pytest.approx(2.0, rel=1e-12, abs=1e-12)
    assert both.details == {"format": 1.0, "rule": 1.0, "reward_model": 0.5}
    alone = combine(None, -0.25, rule_weight=0.0, model_weight=1.0)
    assert (alone.score, alone.details) == (-0.25, {"reward_model": -0.25})
    failed = RewardResult(0.0, status="timeout", error="slow")
    assert combine(failed, 3.0, 1.0, 1.0) is failed


def test_the_reward_worker_adds_the_model_score_to_the_rule(rule_model: tuple[Path, float]) -> None:
    path, _ = rule_model
    policy = build_char_tokenizer()
    cfg = RewardConfig(model_path=str(path), rule_weight=0.5, model_weight=2.0, num_workers=1)
    rm = RewardModel.load(cfg, policy)
    worker = RewardWorker(policy, cfg, reward_model=rm)
    try:
        row, traj = row_and_trajectory(policy, "What is 3+5?", "8")
        row = dataclasses.replace(row, ground_truth="8")
        worker.score_groups([Group(uid="g", row=row, trajectories=[traj])])
    finally:
        worker.close()
    model_score = rm.score([row], [traj], ["8"])[0]
    assert traj.reward_status == "ok" and traj.reward_details == {"rule": 1.0, "reward_model": model_score}
    assert traj.reward == pytest.approx(0.5 * 1.0 + 2.0 * model_score, rel=1e-6, abs=1e-6)


def test_verls_reward_model_keys_map_to_the_model_alone(tmp_path: Path) -> None:
    from asyncrl.config.load import load_train_config

    cfg = load_train_config(None, ["actor_rollout_ref.model.path=tiny", "reward_model.enable=True",
                                   f"reward_model.model.path={tmp_path}", "reward_model.micro_batch_size_per_gpu=4"])
    assert (cfg.reward.model_path, cfg.reward.rule_weight, cfg.reward.model_batch_size) == (str(tmp_path), 0.0, 4)
    assert load_config(None, [f"reward_model.model.path={tmp_path}"]).reward.model_path == ""  # not enabled
    with pytest.raises(ConfigError, match=r"^reward_model.enable=True needs reward_model.model.path"):
        load_config(None, ["reward_model.enable=True"])


@pytest.mark.slow
def test_a_policy_trained_on_the_reward_model_alone_raises_its_rule_score(
        tiny_cache: Path, rule_model: tuple[Path, float], tmp_path: Path) -> None:
    from tests.pipelines.helpers import read_jsonl, run_pipeline

    path, _ = rule_model
    start = time.perf_counter()
    rows = run_pipeline(tmp_path, "reward_model.enable=True", f"reward_model.model.path={path}",
                        "trainer.total_training_steps=12", "trainer.test_freq=0", "trainer.val_before_train=false",
                        "data.train_batch_size=16", "actor.ppo_mini_batch_size=8", "trainer.log_generations=128")
    seconds = time.perf_counter() - start
    generations = [g for g in read_jsonl(tmp_path / "generations.jsonl") if g["split"] == "train"]
    assert all(set(g["reward_parts"]) == {"reward_model"} for g in generations)  # no rule ran (rule_weight 0)
    by_step: dict[int, list[float]] = {}
    for g in generations:
        by_step.setdefault(g["step"], []).append(rule(g["response"]))
    first = [s for step in (1, 2, 3) for s in by_step[step]]
    last = [s for step in (10, 11, 12) for s in by_step[step]]
    before, after = sum(first) / len(first), sum(last) / len(last)
    rewards = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r and r.get("step", 0) >= 1]
    print(f"rule score {before:.3f} -> {after:.3f} in {seconds:.1f} s; reward {rewards[0]:.3f} -> {rewards[-1]:.3f}")
    assert after >= before + 0.15, (before, after)


def test_the_simulator_adds_a_forward_pass_to_the_reward_time() -> None:
    """The reward span of one scored group grows by the reward model's forward over its sequences
    (`costs.reward_model_seconds`, on the engine's devices) and not otherwise."""
    import numpy as np

    from asyncrl.sim import costs
    from asyncrl.sim.loop import run_virtual
    from asyncrl.sim.profile import load_profile
    from asyncrl.sim.workers import SimRolloutServer
    from asyncrl.sim.workload import Workload

    row = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(1,) * 100)

    def reward_span(*overrides: str) -> tuple[float, list[int]]:
        cfg = load_config(None, ["rollout.n=4", "sim.length_median=400", "data.max_response_length=4096", *overrides])
        server = SimRolloutServer(cfg, load_profile("h20-qwen2.5-7b"), 2, Workload(cfg, 3))

        async def main() -> Group:
            group = await server.generate_scored(row, 4, "g", score=False)
            return (await server.score([group]))[0]

        group, _ = run_virtual(main())
        t = group.trajectories[0]
        return t.timings["reward_end"] - t.timings["reward_start"], \
            [len(t.prompt_ids) + len(t.response_ids) for t in group.trajectories]

    plain, lengths = reward_span()
    with_model, same = reward_span("reward.model_path=/models/rm", "reward.model_batch_size=2")
    assert same == lengths  # the same responses, from the same seed
    forward = costs.reward_model_seconds(load_profile("h20-qwen2.5-7b"), np.array(lengths), 2, 2 * (1024 + 4096))
    assert forward > 0 and with_model - plain == pytest.approx(forward, rel=1e-9, abs=1e-9)


def forward_terms(config: LlamaConfig, longest: int) -> int:
    """Terms of the sums from the embedding to the score, each a place where two summation orders
    (packed or padded, other sdpa kernels) round differently: per layer q/k/v (hidden), scores
    (head_dim), the weighted values (the longest row), o (heads x head_dim), gate/up (hidden),
    down (intermediate); then the score head (hidden). `sum_error` over them all bounds what
    reaches the score (RMSNorm renormalises; n eps is the worst case, tests/tolerances.py)."""
    head_dim = config.hidden_size // config.num_attention_heads
    per_layer = 2 * config.hidden_size + head_dim + longest + config.num_attention_heads * head_dim \
        + config.intermediate_size
    return config.num_hidden_layers * per_layer + config.hidden_size


def test_batches_run_packed_and_score_as_padded(tmp_path: Path) -> None:
    """The tiny Llama classifier runs its batches as one packed row (the trainer's packed
    attention, grouped sdpa on the CPU), scoring what the padded classifier scores, within
    float32's rounding over the sums of its forward (`forward_terms`)."""
    from asyncrl.training.packed_attention import PATHS
    from tests.tolerances import sum_error

    tok = build_char_tokenizer()
    classifier(tok, seed=6).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rm = RewardModel.load(RewardConfig(model_path=str(tmp_path)), tok)
    assert (rm.path, rm.refusal) == ("packed", "")
    pairs = responses(9, seed=7)
    rows, trajs = zip(*(row_and_trajectory(tok, q, r, i) for i, (q, r) in enumerate(pairs)))
    batch = [rm.input_ids(r, t, "") for r, t in zip(rows, trajs)]
    assert len({len(ids) for ids in batch}) > 1  # rows of different lengths: the padded batch pads
    before = PATHS["grouped"]
    packed = rm.forward(batch)
    assert PATHS["grouped"] - before == rm.model.config.num_hidden_layers  # one packed attention call per layer
    padded = rm.forward(batch, "padded")
    bound = sum_error(torch.float32, forward_terms(rm.model.config, max(map(len, batch))), max(map(abs, padded)))
    assert packed == pytest.approx(padded, rel=0, abs=bound)
    assert rm.score(rows, trajs, [r for _, r in pairs]) == pytest.approx(padded, rel=0, abs=bound)


def test_a_sliding_window_classifier_runs_padded(tmp_path: Path) -> None:
    from transformers import MistralConfig, MistralForSequenceClassification

    tok = build_char_tokenizer()
    config = MistralConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, intermediate_size=32, sliding_window=8,
                           pad_token_id=tok.pad_token_id)
    config.num_labels = 1
    MistralForSequenceClassification(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rm = RewardModel.load(RewardConfig(model_path=str(tmp_path)), tok)
    assert rm.path == "padded" and "sliding window (8 tokens)" in rm.refusal
    assert rm.model.config._attn_implementation == "sdpa"  # left as it was
    ids = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [5, 6, 7]]
    with torch.no_grad():
        alone = [rm.model(input_ids=torch.tensor([row])).logits[0, 0].item() for row in ids]
    assert rm.forward(ids) == pytest.approx(alone, rel=1e-5, abs=1e-6)


class AnswersEight:
    """The policy's tokenizer as the reward worker uses it: every response decodes to "8"."""

    chat_template = None

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["8" for _ in ids]


def test_validation_scores_with_the_rule_unless_no_rule_scores_the_task(rule_model: tuple[Path, float]) -> None:
    """With the reward model alone (rule_weight 0, verl's reward_model.enable), training rewards are
    its score, while validation (mode "val", through the rollout server) scores with the task's
    rule, as verl's `_validate` does with its rule-based `val_reward_fn`; a data source without a
    rule is validated by the reward model."""
    import asyncio

    from asyncrl.rollout import TorchEngine, engine_settings
    from asyncrl.workers.rollout import RequestBuilder
    from asyncrl.workers.rollout_server import RolloutServer
    from tests.training.helpers import tiny_lm

    path, _ = rule_model
    policy: Any = AnswersEight()
    cfg = RewardConfig(model_path=str(path), rule_weight=0.0, model_weight=2.0, num_workers=1)
    rm = RewardModel.load(cfg, policy)
    worker = RewardWorker(policy, cfg, reward_model=rm)
    engine = TorchEngine(tiny_lm(), 0, engine_settings(RolloutConfig(kv_budget_tokens=1024, max_num_seqs=4)))
    srv = RolloutServer(engine, RequestBuilder(RolloutConfig(temperature=0.0, ignore_eos=True), max_tokens=3, seed=0),
                        worker)
    ruled = PromptRow(uid="p", data_source="arithmetic", messages=({"role": "user", "content": "What is 3+4?"},),
                      ground_truth="7", prompt_ids=(5, 6, 7))
    unruled = dataclasses.replace(ruled, uid="q", data_source="no_rule_for_this")

    async def main() -> list[Group]:
        return [await srv.generate_scored(ruled, 2, "t", "train"), await srv.generate_scored(ruled, 2, "v", "val"),
                await srv.generate_scored(unruled, 2, "u", "val")]

    try:
        train, val, no_rule = asyncio.run(main())
    finally:
        worker.close()
    model_score = rm.score([ruled], [train.trajectories[0]], ["8"])[0]
    assert model_score > 0  # the classifier likes "8" (even), the rule does not (3+4 is 7)
    for t in train.trajectories + no_rule.trajectories:
        assert set(t.reward_details) == {"reward_model"}  # scored two at a time there, alone here
        assert t.reward_details["reward_model"] == pytest.approx(model_score, rel=1e-5, abs=1e-6)
        assert t.reward == pytest.approx(2.0 * t.reward_details["reward_model"], rel=1e-12, abs=0)
    for t in val.trajectories:
        assert (t.reward, t.reward_status) == (0.0, "ok") and "reward_model" not in t.reward_details
    assert worker.has_rule("arithmetic") and not worker.has_rule("no_rule_for_this")
