"""Packed attention: a switched model runs packed rows' attention in groups of similar length
(no (N, N) mask, no N-long attention call), finds rows from restarting positions when not told
them, and runs padded batches exactly as sdpa does. The CUDA FlashAttention path is in tests/gpu."""

from __future__ import annotations

import itertools

import pytest
import torch

from asyncrl.training.actor import response_logits
from asyncrl.training.batch import build_batch
from asyncrl.training.packed_attention import CALL_COST, NAME, packed_mask, row_groups, use_packed_attention
from asyncrl.training.packing import pack
from tests.training.helpers import tiny_lm
from tests.training.test_packing import spread_groups, tail_groups


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """(query length, mask given) of every sdpa call."""
    calls: list[tuple[int, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[-2], attn_mask is not None))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("groups", [spread_groups(), tail_groups()], ids=["spread", "tail"])
def test_packed_rows_attend_in_groups_of_similar_length(attention, groups, sdpa_calls):
    model = tiny_lm().double()
    model.set_attn_implementation(attention)
    use_packed_attention(model)
    assert model.config._attn_implementation == NAME
    batch = build_batch(groups, pad_id=0)
    lengths = tuple(int(n) for n in (batch.attention_mask != 0).sum(-1))
    out = response_logits(model, batch, pack=True)
    longest = [max(lengths[r] for r in rows) for rows in row_groups(lengths)]
    assert sorted(sdpa_calls) == sorted([(n, False) for n in longest] * model.config.num_hidden_layers)
    want = response_logits(tiny_lm().double(), batch, pack=False)
    torch.testing.assert_close(out.logits[0], want.logits[batch.attention_mask[:, batch.prompt_width:] != 0],
                               rtol=1e-10, atol=1e-12)


def cost(lengths: tuple[int, ...], runs) -> int:
    return sum(CALL_COST + len(rows) * max(lengths[r] for r in rows) ** 2 for rows in runs)


@pytest.mark.parametrize("lengths", [(3, 3, 3, 300), (30,) * 200, tuple(range(10, 400, 7)), (64, 1, 5, 20, 40, 12),
                                     (500,) * 3 + (20,) * 50])
def test_row_groups_cover_every_row_once_at_the_least_cost(lengths):
    runs = row_groups(lengths)
    assert sorted(r for rows in runs for r in rows) == list(range(len(lengths)))
    alone, together = [[r] for r in range(len(lengths))], [range(len(lengths))]
    assert cost(lengths, runs) <= min(cost(lengths, alone), cost(lengths, together))


@pytest.mark.parametrize("seed", range(5))
def test_row_groups_match_every_cut_of_the_sorted_rows(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = tuple(int(n) for n in torch.randint(1, 300, (9,), generator=g))
    order = sorted(range(9), key=lambda i: -lengths[i])
    cuts = [[order[a:b] for a, b in itertools.pairwise([0, *cut, 9])]
            for k in range(9) for cut in itertools.combinations(range(1, 9), k)]
    assert cost(lengths, row_groups(lengths)) == min(cost(lengths, runs) for runs in cuts)


def test_short_rows_share_a_call_and_a_long_one_runs_alone():
    assert row_groups((3, 3, 3, 300)) == ((3,), (0, 1, 2))
    assert len(row_groups((30,) * 200)) == 1
    assert sorted(map(sorted, row_groups((500,) * 3 + (20,) * 50))) == [[0, 1, 2], list(range(3, 53))]


def test_rows_come_from_restarting_positions_when_not_given():
    model, plain = tiny_lm(), tiny_lm()
    use_packed_attention(model)
    p = pack(build_batch(spread_groups(), pad_id=0))
    with torch.no_grad():
        got = model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False).logits
        want = plain(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False).logits  # dense mask
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_padded_batches_run_as_with_sdpa():
    model = tiny_lm()
    use_packed_attention(model)
    batch = build_batch(spread_groups(), pad_id=0)
    with torch.no_grad():
        got = response_logits(model, batch).logits
        want = response_logits(tiny_lm(), batch).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_no_mask_is_built_for_packed_rows_only():
    from transformers.masking_utils import sdpa_mask

    plain = dict(batch_size=1, q_length=6, kv_length=6, attention_mask=None, device="cpu", allow_is_causal_skip=False)
    assert packed_mask(**plain) is None and sdpa_mask(**plain) is not None
    for other in (dict(attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]], dtype=torch.bool)),  # padding
                  dict(kv_length=8, kv_offset=2), dict(local_size=3)):  # a cache, a sliding window
        got = packed_mask(**plain | other)
        assert got is not None and torch.equal(got, sdpa_mask(**plain | other)), other
