"""bench/report.py's page merge: regenerating docs/benchmarks.md keeps the sections written by hand."""

from __future__ import annotations

from bench.report import merge


def test_regenerating_replaces_its_own_sections_in_place_and_keeps_the_others() -> None:
    existing = "# B\n\nold intro\n\n## one\n\nold 1\n\n## notes\n\nby hand\n\n## two\n\nold 2\n"
    generated = "# B\n\nintro\n\n## two\n\nnew 2\n\n## one\n\nnew 1\n\n## three\n\nnew 3"
    assert merge(generated, existing) == ("# B\n\nintro\n\n## one\n\nnew 1\n\n## notes\n\nby hand\n\n"
                                          "## two\n\nnew 2\n\n## three\n\nnew 3\n")


def test_a_first_page_is_the_generated_one() -> None:
    assert merge("# B\n\nintro\n\n## one\n\n1\n", "") == "# B\n\nintro\n\n## one\n\n1\n"
