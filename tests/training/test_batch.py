"""Batch layout: left-padded prompts, right-padded responses, rewards on the last trained token;
length-sorted micro-batches trimmed to the columns their rows use; the loss mask (a multi-turn
episode's model tokens) kept apart from the attention through every cut, reorder and move."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from asyncrl.training.batch import (
    HostRows,
    build_batch,
    episode_rows,
    map_micro_batches,
    micro_batches,
    plan_micro_batches,
    row_spans,
    split_rows,
    trim,
)
from tests.training.helpers import (
    episode,
    episode_groups,
    make_groups,
    make_ragged_groups,
    single_turn_as_episodes,
)


def test_layout_places_every_token():
    groups = make_groups()
    batch = build_batch(groups, pad_id=0)
    trajs = [t for g in groups for t in g.trajectories]
    P = batch.prompt_width
    for i, t in enumerate(trajs):
        r = len(t.response_ids)
        assert batch.input_ids[i, P - len(t.prompt_ids):P].tolist() == t.prompt_ids
        assert batch.responses[i, :r].tolist() == t.response_ids
        assert batch.response_mask[i].sum() == r
        assert batch.token_level_scores[i, r - 1] == t.reward and batch.token_level_scores[i].sum() == t.reward
        assert batch.position_ids[i, P - len(t.prompt_ids)] == 0
    assert batch.index == [g.uid for g in groups for _ in g.trajectories]


def test_split_rows_and_select():
    batch = build_batch(make_groups(3, 4), pad_id=0)
    rows = [r for part in split_rows(batch.size, 3) for r in part]
    assert rows == list(range(batch.size))
    sub = batch.select([1, 3])
    assert sub.index == [batch.index[1], batch.index[3]]


def test_plan_sorts_by_length_and_splits_where_padding_costs_more_than_a_micro_batch():
    # Docstring example, rows given longest first: together 4 x 100 + 50 = 450 > 3 x 20 + 50 + 100 + 50.
    prompts, responses = [16] * 4, [84, 4, 4, 4]
    assert plan_micro_batches(prompts, responses, 1000, overhead=50) == [[1, 2, 3], [0]]
    assert plan_micro_batches(prompts, responses, 1000, overhead=300) == [[1, 2, 3, 0]]  # 700 > 400 + 300
    # Budget 40: at most two rows of 20; a row of 100 runs alone. [1, 2] + [3] pads less than [1] + [2, 3].
    assert plan_micro_batches(prompts, [84, 4, 4, 5], 40, overhead=50) == [[1, 2], [3], [0]]
    # Width is the longest prompt plus the longest response: 2 x (17 + 4) = 42 > 40.
    assert plan_micro_batches([17, 16], [3, 4], 40, overhead=0) == [[0], [1]]


def test_row_spans_and_trim_keep_every_token_and_drop_padding_columns():
    batch = build_batch(make_ragged_groups(), pad_id=0)
    P, T = batch.prompt_width, batch.responses.shape[1]
    prompt_B, response_B = row_spans(batch)
    assert prompt_B.tolist() == [2] * 4 + [4] * 4 + [7] * 4
    assert response_B.tolist() == [1, 2, 11, 3, 2, 1, 14, 2, 5, 1, 3, 2]
    rows = [0, 1, 5]  # prompt 2 or 4, responses of 1-2 tokens
    mb = trim(batch.select(rows), prompt_len=4, response_len=2)
    assert mb.input_ids.shape == (3, 6) and mb.prompt_width == 4
    assert torch.equal(mb.input_ids, batch.input_ids[rows, P - 4 : P + 2])
    assert torch.equal(mb.position_ids, batch.position_ids[rows, P - 4 : P + 2])
    assert batch.attention_mask[rows].sum() == mb.attention_mask.sum()  # no real token dropped
    for name in ("responses", "response_mask", "rollout_log_probs", "token_level_scores", "versions"):
        assert torch.equal(getattr(mb, name), getattr(batch, name)[rows, :2]), name
    batch.extras["weights"] = torch.arange(batch.size * T).reshape(batch.size, T)
    assert trim(batch, 7, 3).extras["weights"].shape == (batch.size, 3)


def test_micro_batches_cover_rows_once_within_budget_and_map_back_in_order():
    batch = build_batch(make_ragged_groups(), pad_id=0)
    parts = list(micro_batches(batch, token_budget=30))
    assert sorted(r for rows, _ in parts for r in rows) == list(range(batch.size))
    for rows, mb in parts:
        assert mb.size == len(rows) and (len(rows) == 1 or mb.input_ids.numel() <= 30)
        assert mb.index == [batch.index[r] for r in rows]
        assert mb.response_mask.sum() == batch.response_mask[rows].sum()
    assert min(mb.input_ids.shape[1] for _, mb in parts) < batch.input_ids.shape[1]
    assert [r for rows, _ in parts for r in rows] != list(range(batch.size))  # reordered
    back = map_micro_batches(batch, 30, lambda mb: (mb.responses + 1).float())
    want = (batch.responses + 1).float()
    for i, (_, span) in enumerate(zip(*row_spans(batch), strict=True)):
        assert torch.equal(back[i, :span], want[i, :span])
    assert torch.equal(map_micro_batches(batch, 30, lambda mb: mb.response_mask), batch.response_mask)


def test_an_episode_row_attends_every_token_and_trains_the_model_tokens():
    # The build_batch docstring example: response [a, b, t, t, c, t], loss mask [1, 1, 0, 0, 1, 0],
    # beside a single-turn response of 2 tokens (empty loss mask: all trained).
    a, b, t, c = 5, 6, 7, 8
    multi = episode("e", [3, 4], [[a, b], [c]], [[t, t], [t]], reward=1.0)
    single = make_groups(1, 1)[0]
    single.trajectories[0] = dataclasses.replace(single.trajectories[0], response_ids=[a, b], logprobs=[-1.0] * 2,
                                                 versions=[0, 0], reward=0.5)
    batch = build_batch([dataclasses.replace(single, trajectories=[multi, single.trajectories[0]])], pad_id=0)
    assert batch.has_context_tokens
    assert batch.responses[0].tolist() == [a, b, t, t, c, t]
    assert batch.attention_mask[:, batch.prompt_width:].tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0]]
    assert batch.token_level_scores.tolist() == [[0, 0, 0, 0, 1.0, 0], [0, 0.5, 0, 0, 0, 0]]
    assert batch.rollout_log_probs[0].tolist() == [-1.0, -1.0, 0.0, 0.0, -1.0, 0.0]
    host = HostRows.read(batch)
    assert host.tokens_B == (3.0, 2.0) and host.response_real_B == (6, 2)  # loss counts model tokens


def test_a_single_turn_batch_holds_one_mask_through_cuts_and_moves():
    batch = build_batch(make_ragged_groups(), pad_id=0)
    assert batch.loss_mask is batch.response_mask and not batch.has_context_tokens
    for _, mb in micro_batches(batch, token_budget=30):
        assert mb.loss_mask is mb.response_mask
    moved = batch.to(torch.device("meta"))  # no data: only which tensors are one
    assert moved.loss_mask is moved.response_mask and moved.responses.device.type == "meta"
    spelled = build_batch(single_turn_as_episodes(make_ragged_groups()), pad_id=0)
    assert spelled.has_context_tokens is True and torch.equal(spelled.loss_mask, batch.response_mask)


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batches_keep_the_loss_mask_apart_from_the_attention(packed):
    batch = build_batch(episode_groups(), pad_id=0)
    tool = batch.response_mask - batch.loss_mask
    assert tool.sum() > 0 and batch.loss_mask.sum() > 0
    parts = list(micro_batches(batch, token_budget=24, packed=packed))
    assert len(parts) > 1
    for rows, mb in parts:
        P = mb.prompt_width
        assert torch.equal(mb.attention_mask[:, P:].float(), batch.response_mask[rows, : mb.responses.shape[1]])
    for name in ("loss_mask", "response_mask"):
        back = map_micro_batches(batch, 24, lambda mb, name=name: getattr(mb, name), packed=packed)
        assert torch.equal(back, getattr(batch, name)), name


def test_an_episodes_other_chains_are_rows_before_it_with_its_reward():
    first = episode("e/chain0", [3, 4], [[5, 6]], [], reward=0.0)  # a chain's own reward is never read
    last = dataclasses.replace(episode("e", [3, 9, 4], [[7], [8]], [[2]], reward=1.0), chains=[first])
    other = episode("f", [3, 4], [[5]], [], reward=0.5)
    groups = [dataclasses.replace(make_groups(1, 1)[0], trajectories=[last, other])]
    batch = build_batch(groups, pad_id=0)
    assert episode_rows(groups) == [1, 1, 2] and batch.index == [groups[0].uid] * 3
    assert batch.responses.tolist() == [[5, 6, 0], [7, 2, 8], [5, 0, 0]]
    assert batch.input_ids[:, : batch.prompt_width].tolist() == [[0, 3, 4], [3, 9, 4], [0, 3, 4]]
    assert batch.token_level_scores.tolist() == [[0, 1.0, 0], [0, 0, 1.0], [0.5, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 0]]
