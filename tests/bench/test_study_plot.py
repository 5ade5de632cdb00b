"""bench/study_plot.py: the pooled length CDF, and the figure drawn from a synthetic study."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.study_plot import pooled_cdf


def test_pooled_cdf_pools_lags_and_seeds() -> None:
    cell = {"ledger": {"length_hist_by_lag": {"0": [2, 0], "1": [1, 1]}}}
    assert pooled_cdf([cell]) == ([8, 16], [0.75, 1.0])  # the docstring's example
    wider = {"ledger": {"length_hist_by_lag": {"0": [0, 0, 4]}}}
    assert pooled_cdf([cell, wider]) == ([8, 16, 24], [0.375, 0.5, 1.0])


def test_the_figure_is_drawn_from_a_summary(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench.study import by_arm, summarize
    from bench.study_plot import plot
    from tests.bench.test_protocol import protocol, study_cells

    hist = {"ledger": {"length_hist_by_lag": {"0": [3, 1]}}}
    results = [{**c, **hist} for c in study_cells()]
    path = plot(summarize(protocol(), results), by_arm(protocol(), results), (100, 200), tmp_path)
    assert path == tmp_path / "study_synthetic.png" and path.stat().st_size > 10_000
