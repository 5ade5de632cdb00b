"""Chat-templating prompts with an offline, character-level tokenizer (no hub access)."""

from __future__ import annotations

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from asyncrl.data.tasks import make_task
from asyncrl.data.tokenization import tokenize_rows
from asyncrl.errors import DataError

SPECIAL = ["<|user|>", "<|assistant|>", "<|end|>"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer(chat_template: str | None = TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character plus three special tokens."""
    vocab = {tok: i for i, tok in enumerate(["<unk>", *SPECIAL] + [chr(c) for c in range(32, 127)])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", additional_special_tokens=SPECIAL)
    tok.chat_template = chat_template
    return tok


def test_prompt_ids_are_the_templated_prompt() -> None:
    tok = tiny_tokenizer()
    rows, n_filtered = tokenize_rows(make_task("arithmetic", 4), tok, max_prompt_length=64)
    assert n_filtered == 0 and len(rows) == 4
    content = rows[0].messages[0]["content"]
    expected = [tok.convert_tokens_to_ids("<|user|>")] + [tok.convert_tokens_to_ids(c) for c in content]
    expected += [tok.convert_tokens_to_ids("<|end|>"), tok.convert_tokens_to_ids("<|assistant|>")]
    assert list(rows[0].prompt_ids) == expected


def test_overlong_prompts_are_filtered_and_counted() -> None:
    rows = make_task("arithmetic", 20, seed=1)
    lengths = [len(r.messages[0]["content"]) + 3 for r in rows]
    limit = min(lengths)
    kept, n_filtered = tokenize_rows(rows, tiny_tokenizer(), max_prompt_length=limit)
    assert n_filtered == sum(n > limit for n in lengths) > 0
    assert len(kept) + n_filtered == 20 and all(len(r.prompt_ids) <= limit for r in kept)


def test_overlong_without_filter_raises_naming_config_key() -> None:
    with pytest.raises(DataError, match="data.max_prompt_length"):
        tokenize_rows(make_task("arithmetic", 2), tiny_tokenizer(), 3, filter_overlong=False)


def test_missing_chat_template_names_config_key_and_kwarg_fixes_it() -> None:
    tok = tiny_tokenizer(chat_template=None)
    with pytest.raises(DataError, match="data.chat_template"):
        tokenize_rows(make_task("arithmetic", 1), tok, 64)
    rows, _ = tokenize_rows(make_task("arithmetic", 1), tok, 64, chat_template=TEMPLATE)
    assert rows[0].prompt_ids
