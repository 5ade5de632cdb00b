"""Preflight: each problem it catches before the model loads is one error naming the key to fix."""

from __future__ import annotations

import dataclasses
import json
import os
import string
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from asyncrl import preflight as P
from asyncrl.config import load_config
from asyncrl.data.dataset import load_rows
from asyncrl.errors import ConfigError, DataError
from asyncrl.pipelines.rundir import RUNS_ROOT

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}" \
           "{% if add_generation_prompt %}<|assistant|>{% endif %}"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default output_dir '' puts runs under ./outputs


def char_model_dir(root: Path, *, tokenizer: bool = True) -> Path:
    """A model directory preflight accepts: config, (unloaded) weights, a one-token-per-character
    tokenizer.json and a chat template; nothing here is ever loaded as a model."""
    path = root / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    if tokenizer:
        specials = ["<pad>", "<unk>", "<|end|>", "<|user|>", "<|assistant|>"]
        vocab = {t: i for i, t in enumerate(specials + [c for c in string.printable if c not in "\x0b\x0c\r"])}
        core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        core.add_special_tokens(specials)
        core.save(str(path / "tokenizer.json"))
        (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


def write_jsonl(path: Path, prompts: list[str], data_source: str = "arithmetic") -> str:
    """Conversational rows: each prompt one user message (the chat template applies)."""
    path.write_text("".join(json.dumps({"data_source": data_source, "prompt": [{"role": "user", "content": p}],
                                        "reward_model": {"ground_truth": "1"}}) + "\n" for p in prompts))
    return str(path)


def run(overrides: list[str]) -> list[str]:
    """Preflight's lines; the prompt limit is the tiny model's 64 whatever model a test names."""
    lines: list[str] = []
    P.preflight(load_config(None, ["data.max_prompt_length=64", *overrides]), lines.append, RUNS_ROOT)
    return lines


def test_default_config_passes_and_creates_nothing() -> None:
    assert run([]) == []
    assert not Path("outputs").exists()


def test_unwritable_output_dir_names_the_key(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: a 0o500 directory is writable anyway")
        with pytest.raises(ConfigError, match=r"trainer.output_dir=.*cannot write in .*locked"):
            run([f"trainer.output_dir={locked}/run"])
    finally:
        locked.chmod(0o700)


def test_output_dir_under_a_file_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"trainer.output_dir=.*afile is a file, not a directory"):
        run([f"trainer.output_dir={tmp_path}/afile/run"])


def test_default_output_dir_names_outputs(tmp_path: Path) -> None:
    Path("outputs").write_text("")  # where run directories would go
    with pytest.raises(ConfigError, match=r"trainer.output_dir='' \(runs go under outputs/\)"):
        run([])


@pytest.mark.parametrize(("free", "outcome"), [(0, "error"), (2**20, "warning"), (2**40, "quiet")])
def test_free_space(monkeypatch: pytest.MonkeyPatch, free: int, outcome: str) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(P.shutil, "disk_usage", lambda path: usage(2**41, 2**41 - free, free))
    if outcome == "error":
        with pytest.raises(ConfigError, match="trainer.output_dir=.*disk .* is full"):
            run([])
        return
    lines = run([])
    assert (lines[0].startswith("warning: only 0.00 GiB free for trainer.output_dir") if outcome == "warning"
            else lines == [])


def test_missing_data_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.val_files: .*nope\.jsonl not found"):
        run([f"data.val_files=[{tmp_path}/nope.jsonl]"])


def test_unsupported_data_suffix_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"data.train_files: .*train\.csv is not a supported data file"):
        run([f"data.train_files=[{tmp_path}/train.csv]"])


def test_bad_jsonl_row_names_file_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    good = {"data_source": "arithmetic", "prompt": "1+1?", "reward_model": {"ground_truth": "2"}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "reward_model": {}}) + "\n")
    with pytest.raises(DataError, match=r"train\.jsonl row 1 \(0-based\): field 'reward_model.ground_truth'"):
        run([f"data.train_files=[{path}]"])


def test_empty_data_file(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"data.train_files: .*train\.jsonl has no rows"):
        run([f"data.train_files=[{tmp_path}/train.jsonl]"])


def test_every_prompt_too_long_names_max_prompt_length(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", ["x" * n for n in (100, 150, 70)])
    with pytest.raises(ConfigError) as err:
        run([f"model.path={model}", f"data.train_files=[{data}]", "data.train_batch_size=1",
             "actor.ppo_mini_batch_size=1"])
    # "<|user|>" + prompt + "<|end|><|assistant|>": 3 special tokens around one token per character
    assert str(err.value) == (f"data.max_prompt_length=64 drops 3 of 3 prompts in {data} (longest 153 tokens); "
                              "raise data.max_prompt_length")


def test_some_prompts_too_long_is_one_warning(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", ["x" * n for n in (100, 10, 20)])
    lines = run([f"model.path={model}", f"data.train_files=[{data}]", "data.train_batch_size=2",
                 "actor.ppo_mini_batch_size=2"])
    assert lines == [f"warning: data.max_prompt_length=64 drops 1 of 3 prompts in {data} (longest 103 tokens); "
                     "raise data.max_prompt_length to keep them"]


def test_a_large_file_is_sampled_but_the_error_is_exact(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", ["x" * (100 + i % 7) for i in range(2 * P.SAMPLE_ROWS + 1)])
    with pytest.raises(ConfigError, match=rf"drops {2 * P.SAMPLE_ROWS + 1} of {2 * P.SAMPLE_ROWS + 1} prompts"):
        run([f"model.path={model}", f"data.train_files=[{data}]"])


def test_fewer_prompts_than_a_batch_after_filtering(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", ["x" * n for n in (100, 10, 20)])
    with pytest.raises(ConfigError, match=r"data.train_files hold 2 prompts within data.max_prompt_length=64, "
                                          r"fewer than data.train_batch_size=32"):
        run([f"model.path={model}", f"data.train_files=[{data}]"])


def test_preflight_counts_prompt_tokens_as_the_loader_does(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from asyncrl.data.tokenization import encode_messages, encode_text

    model = char_model_dir(tmp_path)
    rows = load_rows(write_jsonl(tmp_path / "d.jsonl", ["What is 2+3?", "a\nb  c", "x" * 40]))
    counter = P._prompt_length_counter(str(model), "")
    assert counter is not None
    tok = PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"))
    assert counter(rows) == [len(encode_messages(tok, r.messages, TEMPLATE)) for r in rows]
    raw = [dataclasses.replace(rows[0], messages=(), text="<|user|>raw")]  # TRL's standard format: no template
    assert counter(raw) == [len(encode_text(tok, "<|user|>raw"))]


def test_model_dir_without_tokenizer_names_model_path(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path, tokenizer=False)
    with pytest.raises(ConfigError, match=r"model.path=.*model' has no tokenizer \(none of tokenizer.json"):
        run([f"model.path={model}"])


@pytest.mark.parametrize(("make", "needle"), [
    (lambda root: root / "absent", "does not exist"),
    (lambda root: root, "no config.json"),
])
def test_bad_model_path_names_model_path(tmp_path: Path, make, needle: str) -> None:
    with pytest.raises(ConfigError, match=rf"model.path=.*{needle}"):
        run([f"model.path={make(tmp_path)}"])


def test_model_dir_without_weights(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path)
    (model / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"model.path=.* has no weights"):
        run([f"model.path={model}"])


@pytest.mark.parametrize(("spec", "needle"), [
    ("nofunction", "must look like 'file.py:fn'"),
    ("missing_file.py:score", "cannot import 'missing_file.py'"),
    ("{reward}:nope", "has no function 'nope'"),
])
def test_bad_custom_function_names_the_key(tmp_path: Path, spec: str, needle: str) -> None:
    reward = tmp_path / "my_reward.py"
    reward.write_text("def score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=rf"reward.custom_function.*{needle}"):
        run([f"reward.custom_function={spec.format(reward=reward)}"])
    run([f"reward.custom_function={reward}:score"])


def test_unknown_data_source_in_the_data(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "train.jsonl", ["1+1?"] * 40, data_source="my_task")
    with pytest.raises(ConfigError, match="no reward function for data_source 'my_task'.*reward.custom_function"):
        run([f"data.train_files=[{data}]"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_without_a_gpu_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^trainer.device=cuda but torch sees no CUDA device"):
        P.preflight(load_config(None, ["trainer.device=cuda"]), print, RUNS_ROOT)


def test_a_prompt_and_response_past_the_models_positions_names_the_keys(tmp_path: Path) -> None:
    model = char_model_dir(tmp_path)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    too_long = [f"model.path={model}", "data.max_response_length=100"]
    with pytest.raises(ConfigError, match=r"^data.max_prompt_length \+ data.max_response_length = 164 > the 128 "
                                          r"positions of model.path=.*: lower them, or raise model.max_position_emb"):
        run(too_long)
    run([*too_long, "actor_rollout_ref.model.override_config.max_position_embeddings=256"])  # verl's override


def test_node_and_gpu_counts_under_backend_local_are_named() -> None:
    lines: list[str] = []
    P.check_local_counts(load_config(None, ["trainer.n_gpus_per_node=8", "rollout.nnodes=2", "trainer.device=cpu"]),
                         lines.append)
    assert lines == ["backend=local trains in this process on one device: trainer.n_gpus_per_node=8, rollout.nnodes=2 "
                     "not used (backend=ray places workers on them; backend=processes trainer.ranks=N for FSDP2 on "
                     "one machine)"]
    P.check_local_counts(load_config(None, ["trainer.n_gpus_per_node=1"]), lines.append)
    assert len(lines) == 1  # one GPU is what local uses


def test_a_logger_list_without_jsonl_still_writes_metrics_jsonl(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.pipelines import setup

    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(setup, "make_tracker", lambda names, *a, **k: seen.append(tuple(names)))
    monkeypatch.setattr(setup, "generations_paths", lambda ctx: {})
    cfg = load_config(None, ["trainer.logger=[console,tensorboard]"])
    ctx = namedtuple("Ctx", "cfg output_dir plan log trace")(cfg, Path("."), namedtuple("P", "updates")(1), print, None)
    setup.open_tracker(ctx, 0)  # type: ignore[arg-type]
    assert seen == [("console", "tensorboard", "jsonl")]
