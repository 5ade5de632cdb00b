"""Device sampling: inverse CDF draws from softmax(logits / T) under top-k/top-p, the log-prob is
the full distribution's, and the counter-based uniforms make a row's token a function of its
(key, position) alone."""

from __future__ import annotations

import torch

from asyncrl.rollout.sampler import (
    M32,
    DeviceSampler,
    SamplingMode,
    inverse_cdf,
    mix32,
    request_key,
    sample,
    uniform_of,
    uniforms,
)
from asyncrl.types import SamplingParams

DRAWS = 100_000
# 4 sigma of a binomial proportion at p = 0.5 over DRAWS draws: 4 * sqrt(0.25 / 1e5) = 0.0063
ATOL = 0.0065
CPU = torch.device("cpu")


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).float() / tokens.numel()


def draw_many(logits_row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """DRAWS samples of one distribution: one row at DRAWS positions of one key."""
    n, params_n = DRAWS, [params] * DRAWS
    temps = torch.full((n,), params.temperature)
    top_k, top_p = torch.full((n,), params.top_k), torch.full((n,), params.top_p)
    u = uniforms(torch.full((n,), request_key(7)), torch.arange(n))
    tokens, _ = sample(logits_row.expand(n, -1).contiguous(), temps, top_k, top_p, u, SamplingMode.of(params_n))
    return tokens


def test_mix32_is_lowbias32_on_ints_and_tensors_alike() -> None:
    # 1 -> x ^ x>>16 = 1 -> * 0x21F0AAAD = 0x21F0AAAD -> ^ >>15 (0x43E1) = 0x21F0E94C
    #   -> * 0x735A2D97 mod 2**32 = 0x86D3F7D4 -> ^ >>15 (0x10DA7) = 0x86D2FA73
    assert mix32(1) == 0x86D2FA73
    values = torch.randint(0, 2**32, (1000,), generator=torch.Generator().manual_seed(0))
    got = mix32(values)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    assert got.tolist() == [mix32(v) for v in values.tolist()]
    assert int(got.min()) >= 0 and int(got.max()) <= M32


def test_uniforms_are_in_0_1_and_match_the_python_reference() -> None:
    keys = torch.tensor([0, 5, M32, request_key(3), request_key(-3)])
    positions = torch.tensor([0, 1, 2**31 - 1, 17, 4096])
    u = uniforms(keys, positions)
    assert u.dtype == torch.float32
    assert u.tolist() == [uniform_of(k, p) for k, p in zip(keys.tolist(), positions.tolist())]
    many = uniforms(torch.full((DRAWS,), request_key(1)), torch.arange(DRAWS))
    assert float(many.min()) > 0 and float(many.max()) <= 1
    # deciles of U(0, 1]: each holds 0.1 of the draws within 4 sigma (sqrt(0.09 / 1e5) = 0.00095)
    deciles = torch.histc(many, bins=10, min=0, max=1) / DRAWS
    torch.testing.assert_close(deciles, torch.full((10,), 0.1), rtol=0, atol=0.004)


def test_request_keys_differ_for_nearby_seeds_and_streams_do_not_repeat() -> None:
    keys = [request_key(s) for s in range(1000)]
    assert len(set(keys)) == 1000 and all(0 <= k <= M32 for k in keys)
    assert request_key(2**64 + 5) == request_key(5)  # seeds count modulo 2**64
    # two keys' streams over the same positions: equal draws only by chance (about 2**-24 each)
    a = uniforms(torch.full((4096,), keys[0]), torch.arange(4096))
    b = uniforms(torch.full((4096,), keys[1]), torch.arange(4096))
    assert int((a == b).sum()) <= 2


def test_inverse_cdf_matches_probabilities() -> None:
    probs = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.25, 0.05])
    u = uniforms(torch.full((DRAWS,), request_key(2)), torch.arange(DRAWS))
    freq = frequencies(inverse_cdf(probs.expand(DRAWS, -1), u), 6)
    assert freq[0] == 0 and freq[3] == 0  # zero-probability entries are never drawn
    torch.testing.assert_close(freq, probs, rtol=0, atol=ATOL)


def test_inverse_cdf_edges_never_pick_zero_weight_tokens() -> None:
    weights = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]] * 3)
    assert inverse_cdf(weights, torch.tensor([2.0**-24, 1.0, 0.3])).tolist() == [1, 3, 1]


def test_sampled_distribution_is_softmax_of_scaled_logits() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0, 1.5, -3.0, 0.2])
    tokens = draw_many(logits, SamplingParams(temperature=0.7))
    torch.testing.assert_close(frequencies(tokens, 8), torch.softmax(logits / 0.7, -1), rtol=0, atol=ATOL)


def test_top_k_keeps_only_the_k_most_likely_renormalised() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0, 1.5, -3.0, 0.2])
    tokens = draw_many(logits, SamplingParams(temperature=1.0, top_k=3))
    top = torch.tensor([0, 5, 1])
    assert set(tokens.unique().tolist()) == set(top.tolist())
    torch.testing.assert_close(frequencies(tokens, 8)[top], torch.softmax(logits[top], -1), rtol=0, atol=ATOL)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.75 keeps {0, 1} (0.5 < 0.75 <= 0.8)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tokens = draw_many(probs.log(), SamplingParams(temperature=1.0, top_p=0.75))
    assert set(tokens.unique().tolist()) == {0, 1}
    torch.testing.assert_close(frequencies(tokens, 4)[:2], torch.tensor([0.625, 0.375]), rtol=0, atol=ATOL)
    # top-k then top-p on the renormalised top-k mass: k=3 → 0.526, 0.316, 0.158; p=0.5 keeps {0}
    tokens = draw_many(probs.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.5))
    assert tokens.unique().tolist() == [0]


MIXED = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7),
         SamplingParams(temperature=0.7, top_k=2), SamplingParams(temperature=1.3, top_p=0.3)]


def sampler_rows(params: list[SamplingParams], keys: list[int], positions: list[int],
                 logits: torch.Tensor, start: int = 0) -> tuple[list[int], list[float]]:
    """Rows start.. of a fresh DeviceSampler sampled from `logits`: their tokens and log-probs."""
    sampler = DeviceSampler(start + len(params), CPU)
    mode = sampler.set_rows([0] * start + keys, [SamplingParams(temperature=0.0)] * start + params)
    sampler.set_positions([0] * start + positions)
    sampler.sample_rows(logits, start, mode)
    rows = slice(start, start + len(params))
    return sampler.tokens[rows].tolist(), sampler.logprobs[rows].tolist()


def test_logprob_is_full_distribution_before_filtering_and_greedy_uses_t1() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    tokens, logprobs = sampler_rows(MIXED, [1, 2, 3, 4], [10, 11, 12, 13], logits)
    assert tokens[0] == int(logits[0].argmax())
    temps = torch.tensor([1.0, 0.7, 0.7, 1.3])[:, None]
    expected = torch.log_softmax(logits / temps, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(logprobs), expected, rtol=0, atol=1e-6)
    assert tokens[2] in logits[2].topk(2).indices.tolist()


def test_a_rows_token_depends_on_its_key_and_position_only() -> None:
    """The same (key, position, settings, logits) row gives the same token in any batch, at any
    row, whatever the other rows' settings make the step's mode; its position picks the draw."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(4))
    key = request_key(1234)
    for seeded in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=20)):
        draws = []
        for position in range(40):  # alone: no filter / top-k only; in the crowd: top-p's sort
            alone = sampler_rows([seeded], [key], [position], logits[:1])
            crowd = sampler_rows([*MIXED, seeded], [9, 8, 7, 6, key], [1, 2, 3, 4, position],
                                 torch.cat([logits[1:5], logits[:1]]), start=2)
            assert crowd[0][4] == alone[0][0]
            torch.testing.assert_close(crowd[1][4], alone[1][0], rtol=0, atol=1e-6)
            draws.append(alone[0][0])
        assert len(set(draws)) > 10  # a new draw per position


def test_the_mode_is_decided_on_the_host() -> None:
    t1, greedy = SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)
    assert SamplingMode.of([t1, greedy]).unit_temperature  # greedy rows count as T = 1
    assert not SamplingMode.of([t1, SamplingParams(temperature=0.7)]).unit_temperature
    assert SamplingMode.of([SamplingParams(top_k=5), SamplingParams(top_k=40)]).top_k_width == 64
    assert SamplingMode.of([SamplingParams(top_k=5), t1]).top_k_width == 0  # a row keeps the vocabulary
    assert SamplingMode.of([greedy]) == SamplingMode(True, True, True, False, False, False, 0)
    assert not SamplingMode.of([greedy, SamplingParams(temperature=0.0, top_p=0.5)]).filtered


def test_sampling_reads_no_tensor_on_the_host(monkeypatch) -> None:
    """On a GPU a tensor read on the host (bool(), int(), .item()) waits for the device, and a
    captured graph cannot read one at all: the branches come from the host-side mode."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(5))
    settings = ([SamplingParams(temperature=t) for t in (1.0, 1.0, 0.0, 1.0)],
                [SamplingParams(temperature=0.7, top_k=k) for k in (3, 7, 5, 2)],
                [SamplingParams(temperature=1.3, top_p=0.5, top_k=k) for k in (3, -1, 5, 9)],
                MIXED, [SamplingParams(temperature=0.0)] * 4)

    def draw_all() -> list[torch.Tensor]:
        out = []
        for params in settings:
            sampler = DeviceSampler(4, CPU)
            sampler.set_positions([3, 4, 5, 6])
            sampler.sample_rows(logits, 0, sampler.set_rows([1, 2, 3, 4], params))
            out += [sampler.tokens.clone(), sampler.logprobs.clone()]
        return out

    want = draw_all()

    def host_read(*_: object) -> None:
        raise AssertionError("a tensor was read on the host")

    for name in ("__bool__", "__int__", "__float__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    got = draw_all()
    monkeypatch.undo()
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_slot_moves_carry_each_slots_last_token() -> None:
    sampler = DeviceSampler(5, CPU)
    sampler.tokens.copy_(torch.tensor([10, 11, 12, 13, 14]))
    # as the scheduler emits them: 4 -> 1, then 3 -> 0, then 0 -> 2 (slot 0 now holds 3's row)
    sampler.apply_moves([(4, 1, 2), (3, 0, 2), (0, 2, 2), (2, 2, 2)])
    assert sampler.tokens.tolist() == [13, 14, 13, 13, 14]
