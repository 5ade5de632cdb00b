"""Run state as JSON + safetensors: everything a checkpoint holds comes back exactly; a crafted
file (a pickle payload, an unknown type name) is refused in one line and never runs; weights that
no training produces are refused."""

from __future__ import annotations

import json
import math
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.errors import CheckpointError
from asyncrl.state_io import check_weights, load_state, save_state
from asyncrl.training.optim import seed_state
from asyncrl.types import Group, PromptRow, RunLength, Trajectory


class Payload:
    """A pickle that creates `marker` when unpickled (what a crafted checkpoint file carries)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_payload_runs_when_unpickled(tmp_path):
    """The payload the tests below plant is live: unpickling it creates the marker."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


def test_optimizer_rng_and_groups_come_back_exactly(tmp_path):
    moments = {"exp_avg": torch.randn(3, 2), "exp_avg_sq": torch.rand(3, 2)}
    optimizer = {"state": {0: {"step": torch.tensor(1.0), **moments}},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "fused": True, "params": [0]}]}  # AdamW's
    row = PromptRow("u1", "arithmetic", ({"role": "user", "content": "1+1"},), "2", extra_info={"k": [1]},
                    prompt_ids=(5, 6))
    traj = Trajectory("u1/0", [5, 6], [7], [-0.5], [3], "stop", reward=float("nan"), episode={"turns": 2.0})
    sim = Trajectory("s/0", RunLength(((1, 4),)), RunLength(((9, 3),)), RunLength(((0.0, 3),)), RunLength(((2, 3),)),
                     "length")
    random.random()
    tree = {"optimizer": optimizer, "rng": seed_state(), "queue": [Group("u1", row, [traj, sim])],
            "counts": {3: 1, 4: 2}, "$odd": (1.5, None, math.inf), "np": np.float64(0.25)}
    save_state(tree, tmp_path / "s.json")
    back = load_state(tmp_path / "s.json")
    state = back["optimizer"]["state"][0]
    assert torch.equal(state["exp_avg"], optimizer["state"][0]["exp_avg"]) and state["step"].item() == 1
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back["rng"]["python"] == tree["rng"]["python"] and torch.equal(back["rng"]["torch"], tree["rng"]["torch"])
    numpy_back, numpy_then = back["rng"]["numpy"], tree["rng"]["numpy"]
    assert numpy_back[0] == "MT19937" and numpy_back[1].dtype == np.uint32
    assert np.array_equal(numpy_back[1], numpy_then[1]) and numpy_back[2:] == numpy_then[2:]
    group = back["queue"][0]
    assert isinstance(group, Group) and group.row == row and group.trajectories[0].episode == {"turns": 2.0}
    assert math.isnan(group.trajectories[0].reward) and group.trajectories[1].versions == [2, 2, 2]
    assert isinstance(group.trajectories[1].versions, RunLength)
    assert back["counts"] == {3: 1, 4: 2} and back["$odd"] == (1.5, None, math.inf) and back["np"] == 0.25


def test_a_tensor_twice_is_stored_once_and_views_are_copied(tmp_path):
    base = torch.arange(6.0)
    save_state({"a": base, "tied": base, "view": base[2:4]}, tmp_path / "s.json")
    back = load_state(tmp_path / "s.json")
    assert back["a"] is back["tied"] and back["view"].tolist() == [2.0, 3.0]


def test_a_type_outside_the_list_is_refused_when_written(tmp_path):
    with pytest.raises(AssertionError, match="Path"):
        save_state({"x": tmp_path}, tmp_path / "s.json")


@pytest.mark.parametrize("name", ["s.json", "s.safetensors"])
def test_a_planted_pickle_is_refused_in_one_line_and_never_runs(tmp_path, name):
    save_state({"w": torch.ones(2)}, tmp_path / "s.json")
    (tmp_path / name).write_bytes(pickle.dumps(Payload(tmp_path / "ran")))
    with pytest.raises(CheckpointError) as info:
        load_state(tmp_path / "s.json")
    assert name in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("crafted", [
    {"$type": "Popen", "fields": {"args": ["touch", "ran"]}},
    {"$ndarray": "t0", "dtype": "O", "shape": [1]},
    {"$dict": [[["a"], 1]]},
])
def test_crafted_json_names_nothing_outside_the_list(tmp_path, crafted):
    save_state({"w": torch.ones(2)}, tmp_path / "s.json")
    (tmp_path / "s.json").write_text(json.dumps({"w": {"$tensor": "t0"}, "x": crafted}))
    with pytest.raises(CheckpointError, match="does not hold a saved state"):
        load_state(tmp_path / "s.json")


def test_weights_that_are_zero_or_not_finite_are_refused(tmp_path):
    good = {"embed": torch.randn(4, 2), "norm": torch.zeros(2)}
    check_weights(good, tmp_path / "m.safetensors")  # a zero vector (a bias) is fine
    with pytest.raises(CheckpointError, match=r"m.safetensors: weight embed is all zero"):
        check_weights({**good, "embed": torch.zeros(4, 2)}, tmp_path / "m.safetensors")
    check_weights({**good, "embed": torch.zeros(4, 2)}, tmp_path / "m.safetensors", zero_matrices=True)
    with pytest.raises(CheckpointError, match="weight norm holds NaN"):
        check_weights({**good, "norm": torch.tensor([0.0, math.nan])}, tmp_path / "m.safetensors")
