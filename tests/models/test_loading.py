"""`model.path` as a Hugging Face model id resolves from the local HF cache, offline; a miss is one
line naming the cache directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from asyncrl.config.schema import ModelConfig
from asyncrl.errors import ConfigError
from asyncrl.models.loading import check_model_path, load_model, local_tokenizer_dir, resolve_model_path
from asyncrl.models.tokenizer import build_char_tokenizer

REPO = "tiny-org/tiny-gpt2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root: Path) -> Path:
    """A tiny random GPT-2 with the char tokenizer, laid out as huggingface_hub caches it:
    models--org--name/snapshots/<commit>/ plus refs/main holding the commit."""
    repo = root / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2)).save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_model_id_in_the_hf_cache_loads_offline(hub: Path) -> None:
    snapshot = fake_hub_cache(hub)
    assert resolve_model_path(REPO) == snapshot
    check_model_path(REPO)
    assert local_tokenizer_dir(REPO) == snapshot
    model, tok = load_model(ModelConfig(path=REPO))
    assert model.config.model_type == "gpt2" and tok.decode(tok.encode("1+2")) == "1+2"
    torch.testing.assert_close(model.lm_head.weight, GPT2LMHeadModel.from_pretrained(snapshot).lm_head.weight)


def test_hf_home_locates_the_cache_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    fake_hub_cache(tmp_path / "elsewhere")  # not where HF_HOME points
    with pytest.raises(ConfigError, match=str(tmp_path / "hf" / "hub")):
        resolve_model_path(REPO)
    snapshot = fake_hub_cache(tmp_path / "hf" / "hub")
    assert resolve_model_path(REPO) == snapshot


def test_model_id_missing_from_the_cache_names_the_cache_dir(hub: Path) -> None:
    hub.mkdir()
    expected = ("model.path='Qwen/Qwen2.5-0.5B-Instruct' is not a local directory and not in the "
                f"Hugging Face cache {hub} (no {hub}/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots): "
                "download it there with `hf download")
    with pytest.raises(ConfigError) as info:
        check_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    message = str(info.value)
    assert message.startswith(expected) and "\n" not in message and "HF_HUB_CACHE" in message
    assert local_tokenizer_dir("Qwen/Qwen2.5-0.5B-Instruct") is None


def test_incomplete_snapshot_names_model_path_and_the_snapshot(hub: Path) -> None:
    snapshot = fake_hub_cache(hub)
    for weights in snapshot.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ConfigError, match=rf"model.path='{REPO}' \({snapshot}\) has no weights"):
        check_model_path(REPO)


def test_local_directories_win_and_non_ids_are_not_looked_up(tmp_path: Path, hub: Path) -> None:
    local = tmp_path / "m"
    local.mkdir()
    assert resolve_model_path(str(local)) == local
    with pytest.raises(ConfigError, match="does not exist"):
        check_model_path(str(tmp_path / "no" / "such" / "dir"))
