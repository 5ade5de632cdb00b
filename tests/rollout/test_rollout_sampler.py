"""Inverse-CDF sampling draws from softmax(logits / T), respects top-k/top-p, and is seedable."""

from __future__ import annotations

import random

import torch

from asyncrl.rollout.sampler import SamplingBatch, inverse_cdf, sample
from asyncrl.types import SamplingParams

DRAWS = 100_000


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).float() / tokens.numel()


def draw_many(logits_row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """DRAWS samples of one distribution, as one big batch of identical rows."""
    batch = SamplingBatch.build([params] * DRAWS, [None] * DRAWS)
    tokens, _ = sample(logits_row.expand(DRAWS, -1).contiguous(), batch, torch.Generator().manual_seed(0))
    return tokens


def test_inverse_cdf_matches_probabilities() -> None:
    probs = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.25, 0.05])
    u = 1.0 - torch.rand(DRAWS, generator=torch.Generator().manual_seed(1))  # in (0, 1]
    picked = inverse_cdf(probs.expand(DRAWS, -1), u)
    freq = frequencies(picked, 6)
    assert freq[0] == 0 and freq[3] == 0  # zero-probability entries are never drawn
    # 4 sigma of a binomial proportion at p=0.5, n=1e5 is ~0.0063
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.0065)


def test_sampled_distribution_is_softmax_of_scaled_logits() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0, 1.5, -3.0, 0.2])
    tokens = draw_many(logits, SamplingParams(temperature=0.7))
    torch.testing.assert_close(
        frequencies(tokens, 8), torch.softmax(logits / 0.7, -1), rtol=0, atol=0.0065
    )


def test_top_k_keeps_only_the_k_most_likely_renormalised() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0, 1.5, -3.0, 0.2])
    tokens = draw_many(logits, SamplingParams(temperature=1.0, top_k=3))
    freq = frequencies(tokens, 8)
    top = torch.tensor([0, 5, 1])
    assert set(tokens.unique().tolist()) == set(top.tolist())
    expected = torch.softmax(logits[top], -1)
    torch.testing.assert_close(freq[top], expected, rtol=0, atol=0.0065)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.75 keeps {0, 1} (0.5 < 0.75 <= 0.8)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tokens = draw_many(probs.log(), SamplingParams(temperature=1.0, top_p=0.75))
    freq = frequencies(tokens, 4)
    assert set(tokens.unique().tolist()) == {0, 1}
    torch.testing.assert_close(freq[:2], torch.tensor([0.625, 0.375]), rtol=0, atol=0.0065)
    # top-k then top-p on the renormalised top-k mass: k=3 → 0.526, 0.316, 0.158; p=0.5 keeps {0}
    tokens = draw_many(probs.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.5))
    assert tokens.unique().tolist() == [0]


def test_logprob_is_full_distribution_before_filtering_and_greedy_uses_t1() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.7, top_k=2),
        SamplingParams(temperature=1.3, top_p=0.3),
    ]
    batch = SamplingBatch.build(params, [None] * 4)
    tokens, logprobs = sample(logits, batch, torch.Generator().manual_seed(0))
    assert tokens[0] == logits[0].argmax()
    temps = torch.tensor([1.0, 0.7, 0.7, 1.3])[:, None]
    expected = torch.log_softmax(logits / temps, -1).gather(-1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-6)
    assert tokens[2] in logits[2].topk(2).indices


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch() -> None:
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(4))
    seeded = SamplingParams(temperature=1.0, seed=11)

    def draw(row: int, batch_size: int) -> list[int]:
        params = [SamplingParams(temperature=1.0)] * batch_size
        gens: list[random.Random | None] = [None] * batch_size
        params[row], gens[row] = seeded, random.Random(11)
        out = []
        for _ in range(20):  # the per-row generator advances one draw per step
            x = logits[:batch_size].clone()
            x[row] = logits[0]
            out.append(int(sample(x, SamplingBatch.build(params, gens))[0][row]))
        return out

    assert draw(0, 1) == draw(3, 5) == draw(1, 2)


def test_inverse_cdf_edges_never_pick_zero_weight_tokens() -> None:
    weights = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]] * 3)
    picked = inverse_cdf(weights, torch.tensor([1e-12, 1.0, 0.3]))
    assert picked.tolist() == [1, 3, 1]


def test_branch_flags_are_decided_on_the_host() -> None:
    def build(*params: SamplingParams) -> SamplingBatch:
        return SamplingBatch.build(list(params), [None] * len(params))

    t1, greedy = SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)
    assert build(t1, greedy).unit_temperature  # greedy rows count as T = 1
    assert not build(t1, SamplingParams(temperature=0.7)).unit_temperature
    assert build(SamplingParams(top_k=5), SamplingParams(top_k=40)).widest_top_k == 40
    assert build(SamplingParams(top_k=5), t1).widest_top_k == 0  # a row keeps the whole vocabulary
    assert build(greedy).widest_top_k == 0


def test_sample_reads_no_tensor_on_the_host(monkeypatch) -> None:
    """On a GPU a tensor read on the host (bool(), int(), .item()) waits for the device: the
    branches come from the host-side flags instead."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(5))
    settings = ([SamplingParams(temperature=t) for t in (1.0, 1.0, 0.0, 1.0)],
                [SamplingParams(temperature=0.7, top_k=k) for k in (3, 7, 5, 2)],
                [SamplingParams(temperature=1.3, top_p=0.5, top_k=k) for k in (3, -1, 5, 9)],
                [SamplingParams(temperature=0.0)] * 4)

    def draw_all() -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [sample(logits, SamplingBatch.build(params, [None, random.Random(1), None, None]),
                       torch.Generator().manual_seed(0)) for params in settings]

    want = draw_all()

    def host_read(*_: object) -> None:
        raise AssertionError("a tensor was read on the host")

    for name in ("__bool__", "__int__", "__float__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    got = draw_all()
    monkeypatch.undo()
    for (gt, gl), (wt, wl) in zip(got, want):
        assert torch.equal(gt, wt) and torch.equal(gl, wl)
