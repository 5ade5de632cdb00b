"""The figure of a pre-registered study's summary (issue 38): docs/img/study_<study>.png, written by
`python bench/study.py <protocol> --report` where matplotlib is installed (the bench extra).

Three panels: each arm's mean validation score against trained prompts over the seeds of its verdict,
the endpoint window shaded; each arm's paired difference from colocated with its 1 - 2 alpha interval against
the margin (the interval inside +-margin is "equivalent", above -margin "not worse"); and each arm's
trained-length distribution (the cells' histograms pooled, as a CDF) against colocated's, the bias
check. Not here: the verdicts themselves (`bench/study.py`, `bench/verdicts.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.cell_stats import BUCKET, cdf, pooled
from bench.convergence import mean_curve

COLORS = {"equivalent": "tab:green", "not worse": "tab:olive", "better": "tab:blue", "worse": "tab:red",
          "inconclusive": "tab:gray"}
"""A verdict's colour in the interval panel."""


def pooled_cdf(cells: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The trained lengths of `cells` pooled over seeds and lags as a CDF: (bucket upper edges, share).

    Example: one cell with lag 0 [2, 0] and lag 1 [1, 1] (8-token buckets) -> ([8, 16], [0.75, 1.0])."""
    shares = cdf(pooled([cell.get("ledger", {}).get("length_hist_by_lag") or {} for cell in cells])["all"])
    return [BUCKET * (i + 1) for i in range(len(shares))], shares


def plot(summary: dict[str, Any], runs: dict[str, dict[int, dict[str, Any]]], window: tuple[float, float],
         img_dir: Path) -> Path:
    """Write docs/img/study_<study>.png from a summary with verdicts and the admitted cells by arm and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = {"colocated": summary["look"]["seeds"], **{arm: v["look"] for arm, v in summary["arms"].items()}}
    fig, (curves, intervals, lengths) = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm, n in seeds.items():
        cells = [runs[arm][s] for s in range(n)]
        c = mean_curve([cell["points"] for cell in cells])
        width = 2.2 if arm == "colocated" else 1.0
        curves.plot([p["samples"] for p in c], [p["score"] for p in c], label=arm, lw=width)
        if any((cell.get("ledger") or {}).get("length_hist_by_lag") for cell in cells):
            lengths.plot(*pooled_cdf(cells), label=arm, lw=width)
    curves.axvspan(*window, color="0.9")
    curves.set(xlabel="trained prompts", ylabel="validation score (mean over seeds)", title="score; endpoint window")
    curves.legend(fontsize=7)
    arms = list(summary["arms"])
    for y, arm in enumerate(arms):
        v = summary["arms"][arm]
        intervals.plot(v["ci"], [y, y], color=COLORS[v["verdict"]], lw=3)
        intervals.plot([v["mean_diff"]], [y], "o", color=COLORS[v["verdict"]])
    margin = summary["margin"]["margin"]
    for x, style in ((-margin, "--"), (0.0, ":"), (margin, "--")):
        intervals.axvline(x, color="k", ls=style, lw=1)
    intervals.set_yticks(range(len(arms)), [f"{a}: {summary['arms'][a]['verdict']}" for a in arms], fontsize=7)
    intervals.set(xlabel="endpoint - colocated's, paired (CI at 1 - 2 alpha of each verdict's look)",
                  title=f"verdicts at margin {margin:.3f}")
    lengths.set(xlabel="trained response length (tokens)", ylabel="share of trained responses",
                title="trained lengths (bias check)")
    lengths.legend(fontsize=7)
    fig.suptitle(f"{summary['study']}: look at {summary['look']['seeds']} seeds")
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    path = img_dir / f"study_{summary['study']}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
