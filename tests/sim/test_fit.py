import dataclasses

import pytest

from asyncrl.config import load_config
from asyncrl.sim.fit import fit_profile, simulated_phases
from asyncrl.sim.profile import load_profile

CFG = ["data.train_batch_size=32", "actor.ppo_mini_batch_size=8", "rollout.n=4", "data.max_response_length=2048",
       "rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=8", "trainer.total_training_steps=2",
       "sim.length_median=300"]


def test_fit_recovers_the_phase_times_of_a_known_cluster():
    truth = load_profile("h20-qwen2.5-7b")
    truth = dataclasses.replace(truth, train_mfu=truth.train_mfu / 2, decode_mfu=truth.decode_mfu * 1.5)
    cfg = load_config(None, CFG)
    measured = simulated_phases(cfg, truth)
    fitted = fit_profile([(cfg, measured)], load_profile("h20-qwen2.5-7b"), rounds=4, log=lambda _: None)
    got = simulated_phases(cfg, fitted)
    for phase in ("gen", "old_log_prob", "update_actor"):
        assert got[phase] == pytest.approx(measured[phase], rel=0.05, abs=0), phase


def test_cli_fit_writes_a_profile_the_simulator_loads(tmp_path):
    from asyncrl.cli import main
    from asyncrl.sim.run import simulate

    run = load_config(None, [*CFG, f"trainer.output_dir={tmp_path / 'measured'}", "trainer.logger=[jsonl]"])
    simulate(run, log=lambda _: None)  # stands in for a measured run's metrics.jsonl
    out = tmp_path / "mine.yaml"
    assert main(["sim", *CFG, "--fit", str(tmp_path / "measured" / "metrics.jsonl"), "--out", str(out)]) == 0
    assert load_profile(str(out)).name == "mine"
    assert main(["sim", *CFG, f"sim.profile={out}", f"trainer.output_dir={tmp_path / 'again'}"]) == 0


def test_fit_from_a_missing_file_names_the_flag(tmp_path, capsys):
    from asyncrl.cli import main

    assert main(["sim", *CFG, "--fit", str(tmp_path / "nope.jsonl")]) == 2
    assert "--fit" in capsys.readouterr().err


def _step_gens(cfg, profile, out) -> list[float]:
    """The simulated generation seconds of each step after the first, with `profile`."""
    from asyncrl.sim.profile import save_profile
    from asyncrl.sim.run import simulate
    from asyncrl.sim.summary import read_steps

    save_profile(profile, out / f"{profile.name}.yaml")
    cfg = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, profile=str(out / f"{profile.name}.yaml")),
                              trainer=dataclasses.replace(cfg.trainer, output_dir=str(out / profile.name),
                                                          logger=("jsonl",)))
    simulate(cfg, log=lambda _: None)
    return [r["timing_s/gen"] for r in read_steps(out / profile.name / "metrics.jsonl")[1:]]


def test_the_decode_split_is_recovered_from_step_rows(tmp_path):
    """A cluster whose decoding is all per-step cost (cpu-tiny): a start that charges per token
    fits the mean generation time but not the steps; the split fit recovers the steps."""
    from asyncrl.sim.fit import fit_decode_split

    cfg = load_config(None, ["sim.profile=cpu-tiny", "data.task=longtail", "rollout.length_from_prompt=true",
                             "data.max_response_length=256", "data.train_batch_size=16", "actor.ppo_mini_batch_size=8",
                             "rollout.n=4", "trainer.total_training_steps=5", "num_threads=2"])
    truth = dataclasses.replace(load_profile("cpu-tiny"), name="truth")
    measured = _step_gens(cfg, truth, tmp_path)  # stands in for a measured run
    start = dataclasses.replace(truth, name="start", decode_mfu=truth.decode_mfu / 64,
                                mem_bw_gb_s=truth.mem_bw_gb_s / 64)
    start = fit_profile([(cfg, {"gen": sum(measured) / len(measured)})], start, log=lambda _: None, phases=("gen",))
    assert _step_gens(cfg, start, tmp_path) != pytest.approx(measured, rel=0.05, abs=0)
    fitted = fit_decode_split([(cfg, tmp_path / "truth" / "metrics.jsonl")], start, log=lambda _: None)
    assert _step_gens(cfg, dataclasses.replace(fitted, name="fitted"), tmp_path) == pytest.approx(
        measured, rel=0.05, abs=0)
