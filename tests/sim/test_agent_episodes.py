"""`asyncrl sim rollout.agent.entrypoint=...`: an agent's episodes are modelled as tool episodes
(its calls as turns, its own time between calls as tool latency), so a split is planned for it
without importing or running the agent (issue 37)."""

from __future__ import annotations

import json

from asyncrl.config import load_config
from asyncrl.sim.run import simulate
from tests.sim.test_run import MODES, SMALL

AGENT = "rollout.agent.entrypoint=examples/no_such_agent.py:agent"  # never imported by the simulator


def test_an_agent_run_is_simulated_as_multi_turn_episodes(tmp_path):
    cfg = load_config(None, [*SMALL, *MODES["fully_async (d)"].split(), AGENT,
                             "rollout.multi_turn.max_assistant_turns=3", f"trainer.output_dir={tmp_path}"])
    summary = simulate(cfg, log=lambda _: None)
    assert summary.turns == 3 and summary.partial_ratio > 0
    ledger = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(ledger) == 32 * 4 and len({s["prompt"] for s in ledger}) == 32 * 4
