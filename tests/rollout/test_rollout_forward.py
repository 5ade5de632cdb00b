"""The batched forward reproduces the HF forward; the slot cache keeps contents across resizes."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from asyncrl.errors import RolloutError
from asyncrl.rollout.forward import BatchedForward, fast_path_problem
from asyncrl.rollout.kv_cache import SlotKVCache
from tests.rollout.rollout_testlib import FAST_ARCHS, GENERIC_ARCHS, LLAMA3_ROPE, VOCAB, prompt, tiny_model


def hf_last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("arch", FAST_ARCHS)
def test_prefill_then_decode_matches_hf_logits(arch: str) -> None:
    model = tiny_model(arch, seed=1)
    fwd = BatchedForward(model)
    cache = fwd.new_cache(max_slots=8, device="cpu")
    contexts = [list(prompt(n, seed=n)) for n in (5, 11, 2)]
    lengths = torch.tensor([len(c) for c in contexts])
    padded = torch.zeros(3, int(lengths.max()), dtype=torch.int64)
    for row, ctx in enumerate(contexts):
        padded[row, : len(ctx)] = torch.tensor(ctx)
    cache.reserve(3, 16)
    with torch.inference_mode():
        logits = fwd.prefill(cache, padded, lengths, first_slot=0)
    for row, ctx in enumerate(contexts):
        torch.testing.assert_close(logits[row], hf_last_logits(model, ctx), rtol=0, atol=1e-5)
    positions = lengths.clone()
    for step in range(4):  # several decode steps, rows at different positions
        tokens = torch.tensor([(7 * step + row) % VOCAB for row in range(3)])
        with torch.inference_mode():
            logits = fwd.decode(cache, tokens, positions)
        for row in range(3):
            contexts[row].append(int(tokens[row]))
            torch.testing.assert_close(
                logits[row], hf_last_logits(model, contexts[row]), rtol=0, atol=1e-5
            )
        positions += 1


def test_single_row_prefill_uses_plain_causal_attention_and_matches_hf() -> None:
    model = tiny_model("qwen2", seed=2)
    fwd = BatchedForward(model)
    cache = fwd.new_cache(max_slots=4, device="cpu")
    cache.reserve(2, 40)
    ctx = list(prompt(33, seed=5))
    with torch.inference_mode():
        logits = fwd.prefill(cache, torch.tensor([ctx]), torch.tensor([len(ctx)]), first_slot=1)
    torch.testing.assert_close(logits[0], hf_last_logits(model, ctx), rtol=0, atol=1e-5)


def test_the_test_models_exercise_qk_norms_and_llama3_rope() -> None:
    """Guards the two tests above against vacuous models: Qwen3's q/k norms have non-unit weights
    that change the logits, and Llama 3's scaled frequencies differ from plain rope's."""
    qwen3 = tiny_model("qwen3", seed=1)
    attn = qwen3.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)  # random init leaves them at 1
    ctx = list(prompt(9, seed=3))
    fwd, cache = BatchedForward(qwen3), SlotKVCache(2, 2, 32, max_slots=1, dtype=torch.float32, device="cpu")
    cache.reserve(1, len(ctx))
    with torch.inference_mode():
        logits = fwd.prefill(cache, torch.tensor([ctx]), torch.tensor([len(ctx)]), first_slot=0)
    torch.testing.assert_close(logits[0], hf_last_logits(qwen3, ctx), rtol=0, atol=1e-5)
    fwd.qk_norm = False
    with torch.inference_mode():
        without = fwd.prefill(cache, torch.tensor([ctx]), torch.tensor([len(ctx)]), first_slot=0)
    assert (without - logits).abs().max() > 1e-3
    llama3 = tiny_model("llama3")
    assert llama3.config.rope_parameters["rope_type"] == LLAMA3_ROPE["rope_type"]
    plain = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))
    assert not torch.allclose(llama3.model.rotary_emb.inv_freq, plain)


def test_fast_path_takes_its_architectures_and_says_why_not_for_others() -> None:
    assert all(fast_path_problem(tiny_model(a)) is None for a in FAST_ARCHS)
    for arch in GENERIC_ARCHS:
        assert arch in str(fast_path_problem(tiny_model(arch)))


def test_unsupported_architectures_raise_rollout_error() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(RolloutError, match="model_type"):
        BatchedForward(gpt2)
    sliding = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, use_sliding_window=True,
        sliding_window=8, max_window_layers=0,
    )
    with pytest.raises(RolloutError, match="sliding"):
        BatchedForward(Qwen2ForCausalLM(sliding))


def test_cache_reserve_keeps_contents_and_move_compacts() -> None:
    cache = SlotKVCache(2, 1, 2, max_slots=8, dtype=torch.float32, device="cpu", min_capacity=4)
    cache.reserve(2, 3)
    assert (cache.slots, cache.capacity) == (2, 4)
    for layer in range(2):
        cache.keys[layer][1, :, :3] = torch.arange(6.0).view(1, 3, 2) + layer
    cache.reserve(5, 9)  # grow both dimensions to powers of two
    assert (cache.slots, cache.capacity) == (8, 16)
    torch.testing.assert_close(cache.keys[1][1, :, :3].flatten(), torch.arange(6.0) + 1)
    cache.apply_moves([(1, 0, 3)])
    torch.testing.assert_close(cache.keys[0][0, :, :3].flatten(), torch.arange(6.0))
    cache.reserve(1, 3)  # need fell below a quarter: shrink, keeping slot 0
    assert (cache.slots, cache.capacity) == (1, 4)
    torch.testing.assert_close(cache.keys[0][0, :, :3].flatten(), torch.arange(6.0))


def test_cache_moves_compose_like_one_at_a_time() -> None:
    cache = SlotKVCache(1, 1, 1, max_slots=8, dtype=torch.float32, device="cpu", min_capacity=4)
    cache.reserve(5, 2)
    for slot in range(5):
        cache.keys[0][slot] = float(slot)
    # sweep of slots 1 and 4 (4 last, so 4 -> 1, then 1 -> ... ) and a chain 3 -> 0, 0 -> 2
    cache.apply_moves([(4, 1, 2), (3, 0, 2), (0, 2, 2), (2, 2, 2)])
    assert cache.keys[0][:5, 0, :2, 0].tolist() == [[3, 3], [4, 4], [3, 3], [3, 3], [4, 4]]
