"""Configuration: overrides, type checks, unknown keys, cross-field rules, YAML round trip."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Literal

import pytest
import yaml

from asyncrl.algorithms.advantages import ADV_ESTIMATORS
from asyncrl.algorithms.agg import LOSS_AGG_MODES
from asyncrl.algorithms.policy_loss import POLICY_LOSSES
from asyncrl.config import check_pipeline_keys, config_from_dict, documented_yaml, dump_config, field_docs, load_config
from asyncrl.config.fields import knob
from asyncrl.config.load import build
from asyncrl.config.names import AdvEstimatorName, LossAggMode, PolicyLossName, Task, choices
from asyncrl.config.schema import Config
from asyncrl.config.validate import check_fields
from asyncrl.data import TASKS
from asyncrl.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  n: 4\nalgorithm:\n  adv_estimator: rloo\n")
    cfg = load_config(path, ["rollout.n=6", "trainer.logger=[jsonl]", "actor.lr=3e-5"])
    assert cfg.rollout.n == 6 and cfg.algorithm.adv_estimator == "rloo"
    assert cfg.trainer.logger == ("jsonl",) and cfg.actor.lr == pytest.approx(3e-5)


@pytest.mark.parametrize("override, value", [(None, True), ("true", True), ("false", False)])
def test_remove_padding_is_on_by_default(override, value, tmp_path):
    cfg = load_config(None, [] if override is None else [f"model.use_remove_padding={override}"])
    assert cfg.model.use_remove_padding is value
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg
    with pytest.raises(ConfigError, match="model.use_remove_padding"):
        load_config(None, ["model.use_remove_padding=sometimes"])


def test_dump_round_trips_identically(tmp_path):
    cfg = load_config(None, ["pipeline=fully_async", "async_training.staleness_threshold=0.5",
                             "actor.betas=[0.8, 0.95]"])
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg


@pytest.mark.parametrize("override, needle", [
    ("rollout.nn=3", "did you mean rollout.n?"),
    ("algorithm.adv_estimatr=grpo", "did you mean algorithm.adv_estimator?"),
    ("rollout.n=abc", "rollout.n must be int"),
    ("actor.lr=true", "actor.lr must be float"),
    ("algorithm.adv_estimator=grop", "did you mean grpo?"),
    ("data.train_batch_size=30", "actor.ppo_mini_batch_size"),
    ("rollout.n=1", "rollout.n >= 2"),
    ("novalue", "section.key=value"),
])
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(None, [override])
    assert needle in str(err.value)


def test_every_field_is_documented():
    import dataclasses

    def walk(cls):
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
                walk(f.default_factory)

    walk(Config)


def test_choice_lists_match_the_registries():
    assert tuple(ADV_ESTIMATORS) == choices(AdvEstimatorName)
    assert tuple(POLICY_LOSSES) == choices(PolicyLossName)
    assert LOSS_AGG_MODES == choices(LossAggMode)
    assert set(TASKS) == set(choices(Task))


def test_reference_doc_is_current():
    from pathlib import Path

    from asyncrl.config import reference_markdown

    doc = Path(__file__).parents[1] / "docs" / "configuration.md"
    assert doc.read_text().strip() == reference_markdown().strip(), \
        "regenerate: asyncrl config --reference > docs/configuration.md"


@pytest.mark.parametrize("pipeline, override", [
    ("one_step_off", "async_training.staleness_threshold=0.5"),
    ("one_step_off", "async_training.max_version_lag=2"),
    ("colocated", "async_training.use_rollout_log_probs=false"),
    ("colocated", "rollout.total_rollout_steps=64"),
])
def test_a_key_the_pipeline_ignores_is_an_error(pipeline, override):
    from asyncrl.config import check_pipeline_keys

    cfg = load_config(None, [f"pipeline={pipeline}", override])
    with pytest.raises(ConfigError) as err:
        check_pipeline_keys(cfg)
    key = override.split("=")[0]
    assert key in str(err.value) and f"pipeline={pipeline}" in str(err.value)
    check_pipeline_keys(load_config(None, ["pipeline=fully_async", override]))  # read there: fine


@pytest.mark.parametrize("override", [
    "actor.lr=-1", "actor.lr=0", "actor.lr=nan", "actor.lr=.inf", "critic.lr=0", "actor.grad_clip=-1",
    "critic.grad_clip=0", "rollout.temperature=0", "rollout.temperature=11", "rollout.top_p=0", "rollout.top_p=1.5",
    "rollout.top_k=0", "rollout.top_k=-2", "reward.num_workers=0", "reward.timeout_s=0", "reward.timeout_s=nan",
    "reward.max_failure_ratio=0", "reward.max_failure_ratio=1.5", "trainer.max_ckpt_to_keep=-1",
    "trainer.stop_timeout_s=0", "data.train_batch_size=0", "actor.ppo_mini_batch_size=0",
    "data.max_prompt_length=0", "data.max_response_length=0", "actor.clip_ratio_low=-0.1",
    "actor.clip_ratio_high=-0.1", "actor.clip_ratio_c=1", "actor.betas=[0.9, 1.0]", "actor.entropy_coeff=nan",
    "algorithm.gamma=1.5", "algorithm.kl_ctrl.kl_coef=-1", "async_training.max_version_lag=-2",
    "async_training.max_concurrent_samples_per_server=-1",
    "rollout.val_temperature=-1", "sim.accuracy=2", "trainer.resume_mode=no/such/run",
    "rollout.gpu_memory_utilization=0", "rollout.gpu_memory_utilization=1.5",
])
def test_value_rules_reject_naming_key_value_and_fix(override):
    key, _, value = override.partition("=")
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    message = str(err.value)
    assert message.startswith(f"{key}=") and f"set {key}" in message and "\n" not in message
    if value in ("nan", ".inf"):
        assert "not a finite number" in message


def test_temperature_zero_points_to_val_temperature():
    with pytest.raises(ConfigError, match="rollout.val_temperature=0"):
        load_config(None, ["rollout.temperature=0"])


@pytest.mark.parametrize("override", [
    "rollout.top_k=-1", "rollout.top_k=5", "rollout.top_p=1", "rollout.val_temperature=0",
    "trainer.max_ckpt_to_keep=0", "async_training.max_version_lag=-1", "trainer.resume_mode=disable",
    "algorithm.gamma=1", "actor.clip_ratio_low=0",
    "async_training.max_concurrent_samples_per_server=0", "rollout.gpu_memory_utilization=1",
])
def test_value_rules_accept_the_edges(override):
    load_config(None, [override])


def test_partial_rollout_with_threshold_zero_is_accepted():
    # verl's ablation runs it: partial rollout then has nothing in flight to interrupt at a sync
    cfg = load_config(None, ["pipeline=fully_async", "async_training.partial_rollout=true"])
    assert cfg.async_training.partial_rollout and cfg.async_training.staleness_threshold == 0


def test_resume_mode_accepts_an_existing_directory(tmp_path):
    assert load_config(None, [f"trainer.resume_mode={tmp_path}"]).trainer.resume_mode == str(tmp_path)


def test_missing_yaml_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*nope\.yaml not found"):
        load_config(tmp_path / "nope.yaml")


def test_malformed_yaml_names_file_line_and_column(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  n: 4\n  top_k: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "line 4, column 1" in str(err.value)
    assert "\n" not in str(err.value)


def test_yaml_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path)


def test_documented_yaml_reads_back_identically_with_awkward_strings():
    from asyncrl.config import documented_yaml

    template = "{% for m in messages %}\n  {{ m['content'] }} # x: y\n{% endfor %}"
    cfg = config_from_dict({"data": {"chat_template": template}, "trainer": {"logger": ["jsonl"]}})
    text = documented_yaml(cfg)
    assert config_from_dict(yaml.safe_load(text)) == cfg
    assert "  max_prompt_length: 64  # Longer prompts are dropped (counted), or cut as data.truncation says when " \
           "filter_overlong_prompts is false. Range: >= 1." in text.splitlines()


def test_hydra_plus_forms_set_our_keys_too():
    cfg = load_config(None, ["+rollout.n=4", "++actor.lr=1e-5"])
    assert (cfg.rollout.n, cfg.actor.lr) == (4, 1e-5)


@pytest.mark.parametrize("key, message", [
    ("rollout.n.x", "unknown config key rollout.n.x: rollout.n is a value, not a section"),
    ("rollout.foo.bar", "unknown config key rollout.foo.bar; valid keys in rollout: n, temperature, "),
    ("algorithm.kl_ctrl.coeff", "unknown config key algorithm.kl_ctrl.coeff; valid keys in algorithm.kl_ctrl: type, "),
])
def test_an_unknown_key_names_where_it_went_wrong(key, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}=1"])
    assert str(err.value).startswith(message)


def test_dynamic_sampling_runs_in_every_pipeline():
    for pipeline in ("colocated", "one_step_off", "fully_async"):
        assert load_config(None, [f"pipeline={pipeline}", "algorithm.filter_groups.enable=true"])


def test_old_log_probs_is_read_by_colocated_only():
    with pytest.raises(ConfigError, match="actor.old_log_probs"):
        check_pipeline_keys(load_config(None, ["pipeline=fully_async", "actor.old_log_probs=rollout"]))


@dataclasses.dataclass(frozen=True)
class NewSection:
    mode: Literal["fast", "careful"] = "fast"
    """How the new component works."""
    rounds: int = knob(2, ">= 1", hint="one round is the plain run")
    """Rounds per step."""


@dataclasses.dataclass(frozen=True)
class WithNewSection:
    new: NewSection = dataclasses.field(default_factory=NewSection)
    """A component added by declaring its section and nothing else."""


def test_a_new_key_is_checked_documented_and_named_from_its_declaration_alone():
    assert build(WithNewSection, {"new": {"mode": "careful", "rounds": 3}}, "") == \
        WithNewSection(NewSection("careful", 3))
    wrong = r"^new.mode='carefull' is not one of fast, careful \(did you mean careful\?\)$"
    with pytest.raises(ConfigError, match=wrong):
        check_fields(build(WithNewSection, {"new": {"mode": "carefull"}}, ""))
    with pytest.raises(ConfigError, match=r"^new.rounds=0 is out of range: set new.rounds >= 1 \(one round is"):
        check_fields(build(WithNewSection, {"new": {"rounds": 0}}, ""))
    with pytest.raises(ConfigError, match="unknown config key new.round"):
        build(WithNewSection, {"new": {"round": 1}}, "")
    lines = documented_yaml(WithNewSection()).splitlines()  # type: ignore[arg-type]
    assert "  mode: fast  # How the new component works. One of: fast, careful." in lines
    assert "  rounds: 2  # Rounds per step. Range: >= 1." in lines


def test_config_imports_without_torch():
    """`asyncrl config` and command-line checks run where torch is not installed."""
    code = ("import sys\n"
            "class NoTorch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'transformers', 'numpy'):\n"
            "            raise ImportError('no ' + name)\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import asyncrl.config, asyncrl.scheduling.plan\n"
            "cfg = asyncrl.config.load_config(None, ['pipeline=fully_async'])\n"
            "print(asyncrl.scheduling.plan.plan_run(cfg).line())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("plan: fully_async, 1920 prompts")


def test_on_and_off_choices_survive_yamls_booleans():
    cfg = load_config(None, ["rollout.fused_decode=off", "rollout.packed_prefill=off"])
    assert (cfg.rollout.fused_decode, cfg.rollout.packed_prefill) == ("off", "off")
    assert load_config(None, ["rollout.fused_decode=on"]).rollout.fused_decode == "on"


@pytest.mark.parametrize("override, needle", [
    ("rollout.ignore_eos=true", "rollout.ignore_eos=false"),
    ("rollout.multi_turn.max_episode_tokens=100", "rollout.multi_turn.max_episode_tokens=100 leaves no room"),
])
def test_multi_turn_rules_name_the_keys(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.multi_turn.enable=true", "data.max_prompt_length=128", override])
    assert needle in str(err.value)
    load_config(None, [override, "data.max_prompt_length=128"])  # single turn: no rule
