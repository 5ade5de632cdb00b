"""Turn `PromptRow.messages` into `prompt_ids` with the tokenizer's chat template, or `PromptRow.text` without one.

Applies `tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`
row by row (a raw-text row, TRL's standard format, is encoded as it is, adding no special tokens,
as TRL does) and drops (and counts) prompts longer than `data.max_prompt_length`. It does not
pad, batch or truncate: a prompt is either kept whole or filtered, never cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl.errors import ConfigError, DataError
from asyncrl.types import PromptRow


def tokenize_rows(
    rows: Sequence[PromptRow],
    tokenizer: Any,
    max_prompt_length: int,
    *,
    filter_overlong: bool = True,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[PromptRow], int]:
    """Return (rows with `prompt_ids` filled, number filtered as longer than max_prompt_length).

    `chat_template` (config `data.chat_template`) overrides the tokenizer's own template;
    `template_kwargs` (`data.chat_template_kwargs`) are extra variables it renders with.
    With `filter_overlong=False` an overlong prompt raises `DataError` instead of being dropped.
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template and any(not r.text for r in rows):
        raise DataError(
            "the tokenizer has no chat template; set data.chat_template to a jinja template "
            "string (e.g. \"{% for m in messages %}{{ m['content'] }}{% endfor %}\")"
        )
    kept: list[PromptRow] = []
    n_filtered = 0
    for row in rows:
        ids = (encode_text(tokenizer, row.text) if row.text
               else encode_messages(tokenizer, row.messages, template or "", **(template_kwargs or {})))
        if len(ids) <= max_prompt_length:
            kept.append(dataclasses.replace(row, prompt_ids=tuple(ids)))
        elif filter_overlong:
            n_filtered += 1
        else:
            raise DataError(
                f"prompt of row '{row.uid}' has {len(ids)} tokens > data.max_prompt_length="
                f"{max_prompt_length}; raise data.max_prompt_length"
            )
    return kept, n_filtered


def template_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    """`data.chat_template_kwargs` as a mapping: ["enable_thinking=false"] -> {"enable_thinking": False}."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise ConfigError(f"data.chat_template_kwargs: {pair!r} must look like name=value "
                              f"(e.g. enable_thinking=false)")
        out[name] = yaml.safe_load(value) if value else ""
    return out


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """A raw-text prompt's ids, no special tokens added (TRL's standard format)."""
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def encode_messages(tokenizer: Any, messages: Sequence[dict[str, str]], template: str, **kwargs: Any) -> list[int]:
    """Chat-template and tokenize one conversation, ending with the generation prompt; `kwargs` are
    the template's extra variables (Qwen3's `enable_thinking`)."""
    out = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        chat_template=template,
        add_generation_prompt=True,
        tokenize=True,
        **kwargs,
    )
    # transformers 5 returns a BatchEncoding (a Mapping); 4.x returns a list of ids.
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        assert len(out) == 1, "one conversation in, one id list out"
        out = out[0]
    return [int(t) for t in out]
