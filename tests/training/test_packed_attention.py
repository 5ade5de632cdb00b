"""Packed attention: a switched model runs packed rows' attention in groups of similar length
(no (N, N) mask, no N-long attention call), finds rows from restarting positions when not told
them, and runs padded batches exactly as sdpa does. Each call takes the path its torch, device
and dtype allow (`choose`, the kernels faked as each torch release has them), records it in
`PATHS`, and through each path equals the padded model. The CUDA kernels themselves run in
tests/gpu."""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from asyncrl.errors import ConfigError
from asyncrl.training import attention_kernels as kernels
from asyncrl.training import packed_attention as pa
from asyncrl.training.batch import build_batch
from asyncrl.training.logits import response_logits
from asyncrl.training.packed_attention import CALL_COST, NAME, packed_mask, row_groups, use_packed_attention
from asyncrl.training.packing import pack
from tests.training.helpers import tiny_lm
from tests.training.test_attention_kernels import nested_rows_alone, released
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


# --- which path runs (`choose`), the kernels faked where this CPU has none ---------------------

VARLEN = released([])  # the stand-in varlen_attn of each release (tests/training/test_attention_kernels.py)


def fake_kernels(monkeypatch: pytest.MonkeyPatch, varlen: str | None, jagged: bool) -> None:
    """This torch as one with `varlen` (a release's signature, or none) and nested jagged tensors or not."""
    module = None if varlen is None else SimpleNamespace(varlen_attn=VARLEN[varlen])
    monkeypatch.setattr(kernels, "_varlen_module", lambda: module)
    monkeypatch.setattr(kernels, "jagged_kernel", lambda: jagged)


BF16, F32 = torch.bfloat16, torch.float32
CHOICES = [  # (id, path, torch's varlen, jagged, cuda, dtype, dropout, window matters) -> path run
    ("auto-cuda-bf16-torch2.11", "auto", "torch-2.11", True, True, BF16, 0.0, False, "varlen"),
    ("auto-cuda-bf16-torch2.10", "auto", "torch-2.10", True, True, BF16, 0.0, False, "varlen"),
    ("auto-cuda-fp16-torch2.12", "auto", "torch-2.12+", True, True, torch.float16, 0.0, False, "varlen"),
    ("auto-cuda-fp32", "auto", "torch-2.12+", True, True, F32, 0.0, False, "jagged"),
    ("auto-cuda-dropout", "auto", "torch-2.12+", True, True, BF16, 0.1, False, "jagged"),
    ("auto-cuda-torch2.4-2.9", "auto", None, True, True, BF16, 0.0, False, "jagged"),
    ("auto-cuda-no-kernels", "auto", None, False, True, BF16, 0.0, False, "grouped"),
    ("auto-cpu", "auto", "torch-2.12+", True, False, BF16, 0.0, False, "grouped"),
    ("auto-window-torch2.11", "auto", "torch-2.11", True, True, BF16, 0.0, True, "varlen"),
    ("auto-window-torch2.10", "auto", "torch-2.10", True, True, BF16, 0.0, True, "masked"),
    ("auto-window-cpu", "auto", "torch-2.12+", True, False, F32, 0.0, True, "masked"),
    ("jagged-forced-cuda-bf16", "jagged", "torch-2.12+", True, True, BF16, 0.0, False, "jagged"),
    ("jagged-forced-cpu", "jagged", "torch-2.12+", True, False, F32, 0.0, False, "grouped"),
    ("varlen-forced-cuda-fp32", "varlen", "torch-2.12+", True, True, F32, 0.0, False, "grouped"),
    ("grouped-forced-cuda-bf16", "grouped", "torch-2.12+", True, True, BF16, 0.0, False, "grouped"),
]


@pytest.mark.parametrize(("path", "varlen", "jagged", "cuda", "dtype", "dropout", "window", "runs"),
                         [c[1:] for c in CHOICES], ids=[c[0] for c in CHOICES])
def test_each_call_takes_the_path_its_torch_device_and_dtype_allow(monkeypatch, path, varlen, jagged, cuda, dtype,
                                                                    dropout, window, runs):
    fake_kernels(monkeypatch, varlen, jagged)
    assert pa.choose(path, cuda, dtype, dropout, window) == runs


def test_a_torch_without_kernels_says_so_once_on_cuda(monkeypatch, caplog):
    fake_kernels(monkeypatch, None, False)
    kernels.note_grouped_on_cuda.cache_clear()
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        for _ in range(3):
            assert pa.choose("auto", True, BF16, 0.0, False) == "grouped"
        assert pa.choose("auto", False, BF16, 0.0, False) == "grouped"
    assert [r.getMessage() for r in caplog.records if r.name == kernels.__name__] == [
        f"packed attention: torch {torch.__version__} has neither torch.nn.attention.varlen (2.10+) nor nested "
        "jagged tensors (2.4+); packed rows on CUDA run as grouped sdpa calls"]
    kernels.note_grouped_on_cuda.cache_clear()


def as_if_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every packed call chooses as a CUDA bf16 call would (the kernels still run here, in float64)."""
    choose = pa.choose
    monkeypatch.setattr(pa, "choose", lambda path, cuda, dtype, dropout, window: choose(path, True, BF16, dropout,
                                                                                         window))


@pytest.fixture
def paths() -> Counter[str]:
    pa.PATHS.clear()
    return pa.PATHS


def packed_vs_padded(model: torch.nn.Module, groups) -> None:
    batch = build_batch(groups, pad_id=0)
    got = response_logits(model, batch, pack=True).logits[0]
    want = response_logits(tiny_lm().double(), batch, pack=False).logits
    torch.testing.assert_close(got, want[batch.attention_mask[:, batch.prompt_width:] != 0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("release", list(VARLEN))
def test_packed_rows_run_through_each_releases_varlen_once_per_layer(monkeypatch, paths, release):
    fake_kernels(monkeypatch, release, True)
    as_if_cuda(monkeypatch)
    model = tiny_lm().double()
    use_packed_attention(model)
    packed_vs_padded(model, spread_groups())
    assert paths == {"varlen": model.config.num_hidden_layers}


def packed_forward(model: torch.nn.Module, rows: list[torch.Tensor], **extra) -> torch.Tensor:
    """`model`'s logits over `rows` packed as the trainer packs them, the rows' lengths as host ints."""
    lengths = tuple(len(r) for r in rows)
    bounds = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        return model(input_ids=torch.cat(rows)[None], position_ids=positions, cu_seq_lens_q=bounds,
                     cu_seq_lens_k=bounds, max_length_q=max(lengths), max_length_k=max(lengths), use_cache=False,
                     **{pa.ROWS: lengths}, **extra).logits[0]


ROWS_OF = [torch.arange(1, 12), torch.arange(3, 10), torch.arange(20, 30)]  # 11, 7, 10 tokens (ids < 32)


@pytest.mark.parametrize("path", ["auto", "grouped"])
def test_given_the_rows_lengths_no_layer_reads_the_device(monkeypatch, paths, path):
    monkeypatch.setattr(pa, "_lengths", lambda bounds: pytest.fail("the rows' lengths were read from the device"))
    fake_kernels(monkeypatch, "torch-2.11", True)
    as_if_cuda(monkeypatch)
    model = tiny_lm().double()
    use_packed_attention(model, path)
    got = packed_forward(model, ROWS_OF)
    with torch.no_grad():
        alone = torch.cat([tiny_lm().double()(input_ids=r[None], use_cache=False).logits[0] for r in ROWS_OF])
    torch.testing.assert_close(got, alone, rtol=1e-10, atol=1e-12)
    assert paths == {"varlen" if path == "auto" else "grouped": model.config.num_hidden_layers}


def test_forced_jagged_runs_nested_rows_and_matches_grouped(monkeypatch, paths):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    nested = nested_rows_alone([])
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *args, **kwargs: (nested if q.is_nested else sdpa)(q, *args, **kwargs))
    fake_kernels(monkeypatch, "torch-2.12+", True)
    as_if_cuda(monkeypatch)
    jagged, grouped = tiny_lm().double(), tiny_lm().double()
    use_packed_attention(jagged, "jagged")
    use_packed_attention(grouped, "grouped")
    batch = build_batch(tail_groups(), pad_id=0)
    got, want = (response_logits(m, batch, pack=True).logits for m in (jagged, grouped))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    layers = jagged.config.num_hidden_layers
    assert paths == {"jagged": layers, "grouped": layers}


def test_the_path_is_chosen_once_per_model_and_kept(monkeypatch):
    model = tiny_lm()
    use_packed_attention(model, "grouped")
    assert model.config._attn_implementation == pa.attention_name("grouped") == f"{NAME}_grouped"
    use_packed_attention(model)  # as enable_packing does after the factory chose
    assert model.config._attn_implementation == f"{NAME}_grouped"
    use_packed_attention(model, "auto")
    assert model.config._attn_implementation == NAME
    fake_kernels(monkeypatch, None, True)
    with pytest.raises(ConfigError, match="model.packed_attention=varlen"):
        use_packed_attention(model, "varlen")


def windowed_lm(window: int) -> torch.nn.Module:
    """A Mistral-shaped tiny model (grouped KV heads) whose layers attend `window` keys back."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=64, sliding_window=window, head_dim=8)
    return MistralForCausalLM(cfg).double().eval()


@pytest.mark.parametrize(("window", "varlen", "runs"), [
    (3, "torch-2.11", "varlen"),  # the window narrower than the rows, taken by the kernel
    (3, "torch-2.10", "masked"),  # narrower, not taken: transformers' mask
    (64, "torch-2.11", "varlen"),  # wider than every row: changes nothing
    (64, None, "grouped"),
], ids=["window-3-varlen-2.11", "window-3-varlen-2.10", "window-64-varlen-2.11", "window-64-grouped"])
def test_a_sliding_window_keeps_each_row_as_run_alone(monkeypatch, paths, window, varlen, runs):
    fake_kernels(monkeypatch, varlen, False)
    as_if_cuda(monkeypatch)
    model = windowed_lm(window)
    use_packed_attention(model)
    with torch.no_grad():
        alone = torch.cat([windowed_lm(window)(input_ids=r[None], use_cache=False).logits[0] for r in ROWS_OF])
    torch.testing.assert_close(packed_forward(model, ROWS_OF), alone, rtol=1e-10, atol=1e-12)
    assert paths == {runs: model.config.num_hidden_layers}


def test_on_cuda_a_call_costs_dispatch_so_short_rows_share_one():
    lengths = tuple(range(30, 300, 4))  # 68 rows of 30-298 tokens: 68 x 298^2 = 6.0M token pairs padded together
    cuda = pa.call_cost("cuda", BF16, 14 * 64)  # Qwen2-0.5B's attention width
    assert pa.call_cost("cpu", BF16, 14 * 64) == CALL_COST
    assert cuda == pytest.approx(pa.CUDA_CALL_S * 3e14 / (7 * 896))
    assert len(row_groups(lengths, cuda)) == 1 < len(row_groups(lengths))
    assert pa.call_cost("cuda", F32, 896) < cuda  # float32 attention computes fewer pairs per dispatch
