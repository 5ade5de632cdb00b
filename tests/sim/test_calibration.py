"""The built-in h20-qwen2.5-7b profile reproduces SPEC §6's colocated rows within 10% per phase,
with the per-row median response lengths bench/calibrate.py fitted (the rows do not report them)."""

import pytest

from asyncrl.sim.fit import simulated_phases
from asyncrl.sim.profile import load_profile
from bench.calibrate import ROWS, row_config

FITTED_MEDIANS = {32: 614, 64: 367, 128: 516}


@pytest.mark.parametrize("gpus", sorted(ROWS))
def test_colocated_rows_within_ten_percent(gpus):
    sim = simulated_phases(row_config(gpus, FITTED_MEDIANS[gpus], steps=8), load_profile("h20-qwen2.5-7b"))
    for phase in ("gen", "old_log_prob", "update_actor"):
        assert sim[phase] == pytest.approx(ROWS[gpus][phase], rel=0.10, abs=0), phase
