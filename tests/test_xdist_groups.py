"""`./run.sh test` sends the tests on Ray, and those of the tiny-tools model, each to one xdist worker
(tests/conftest.py), so one Ray cluster serves them all and the model is warmed up once. On pytest
9.2 pytest-xdist 3.8's `--dist loadgroup` stopped grouping without a word (pytest-xdist#1386: its
node-id suffix no longer takes): both workers then started Ray and warmed the model up, and the
suite ran minutes longer. This test fails if grouping stops again."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("ray")
def test_loadgroup_puts_a_grouped_test_in_its_group(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under `--dist loadgroup` (./run.sh test)")
    assert request.node.nodeid.endswith("@ray"), request.node.nodeid
