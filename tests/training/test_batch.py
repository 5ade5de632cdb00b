"""Batch layout: left-padded prompts, right-padded responses, rewards on the last token."""

from __future__ import annotations

import torch

from asyncrl.training.batch import build_batch, micro_batches, split_rows
from tests.training.helpers import make_groups


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


def test_select_and_micro_batches_cover_all_rows():
    batch = build_batch(make_groups(3, 4), pad_id=0)
    rows = [r for part in split_rows(batch.size, 3) for r in part]
    assert rows == list(range(batch.size))
    width = batch.input_ids.shape[1]
    parts = list(micro_batches(batch, token_budget=width * 5))
    assert [p.size for p in parts] == [5, 5, 2]
    assert torch.equal(torch.cat([p.responses for p in parts]), batch.responses)
    sub = batch.select([1, 3])
    assert sub.index == [batch.index[1], batch.index[3]]
