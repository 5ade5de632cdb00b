"""The role protocols are the contract: the static check names what a new worker lacks or what a
pipeline calls that no role has, and every shipped implementation keeps the contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]

DRIFT = """
from asyncrl.roles import Engine, PauseMode, TrainerSide
from asyncrl.types import EngineStats, GenerationRequest, Trajectory


class ForgetfulEngine:  # a new engine without abort_all
    async def generate(self, request: GenerationRequest) -> Trajectory: ...
    async def abort(self, request_ids: object) -> list[Trajectory]: ...
    async def pause(self, mode: PauseMode = "keep") -> list[Trajectory]: ...
    async def resume(self) -> None: ...
    async def load_weights(self, named_tensors: object, version: int) -> None: ...
    def weights_checksum(self) -> str: ...
    def stats(self) -> EngineStats: ...


ENGINE: Engine = ForgetfulEngine()


async def pipeline(t: TrainerSide) -> None:
    await t.train_group([])
"""


@pytest.mark.slow
def test_mypy_tells_the_author_what_is_missing(tmp_path):
    snippet = tmp_path / "drift.py"
    snippet.write_text(DRIFT)
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", str(snippet)],
                         capture_output=True, text=True, cwd=REPO).stdout
    assert 'variable has type "Engine"' in out and "abort_all" in out, out
    assert '"TrainerSide" has no attribute "train_group"; maybe "train_groups"?' in out, out


def test_real_and_simulated_workers_offer_every_role_method():
    """The runtime view of what mypy checks (so a missing method fails fast without mypy too)."""
    from asyncrl.roles import Engine, RolloutSide, TrainerSide
    from asyncrl.rollout.engine import TorchEngine
    from asyncrl.sim.workers import SimRolloutServer, SimTrainer
    from asyncrl.workers.rollout_server import RolloutServer
    from asyncrl.workers.trainer import PPOTrainer

    def members(protocol: type) -> set[str]:
        return {n for base in protocol.__mro__ if base.__module__ == "asyncrl.roles"
                for n in vars(base) if not n.startswith("_")}

    for protocol, classes in ((Engine, [TorchEngine]), (RolloutSide, [RolloutServer, SimRolloutServer]),
                              (TrainerSide, [PPOTrainer, SimTrainer])):
        for cls in classes:
            missing = {m for m in members(protocol) if not callable(getattr(cls, m, None))}
            assert not missing, f"{cls.__name__} lacks {missing}"
