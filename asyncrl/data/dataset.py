"""Read and write prompt datasets in the verl layout (parquet, JSONL or JSON) as `PromptRow`s.

A row has `data_source` (str, picks the reward function), `prompt` (a list of chat messages
`{"role", "content"}`), `ability` (str, optional), `reward_model` (a dict/struct with
`ground_truth` and optionally `style`) and `extra_info` (a dict/struct, optional).

Decisions:
- `uid` is `f"{split_name}-{extra_info['index']}"` when `extra_info` has an `index`, else
  `f"{split_name}-{row_index}"`. Duplicate uids are an error (GRPO groups by uid).
- `ground_truth` is always a str: numbers via `str()`, lists/dicts as JSON.
- `.json` holds either one JSON array of rows or, as `datasets.Dataset.to_json` writes it, JSON
  lines.
- `prompt` as a list of messages gets the chat template (TRL's conversational format); `prompt`
  as a plain string is raw text, tokenized as it is without a template (TRL's standard format, and
  what a pre-templated dataset holds: templating it twice would be silently wrong).
- Parquet cannot tell a missing struct key from a null one, so `None` values in `extra_info`
  are dropped on load.

Malformed rows raise `DataError` naming the file, the 0-based row and the field; one function,
`row_from_record`, checks a row, for training and for `asyncrl.preflight` alike. Prompts longer than
`data.max_prompt_length` are counted and reported by `check_prompt_lengths`, naming the key.
Tokenization lives in `tokenization.py`; this module does not touch tokenizers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.errors import ConfigError, DataError
from asyncrl.types import PromptRow

_MESSAGES_HINT = "must be a list of {role, content} messages or a non-empty string (raw text)"
SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


def load_rows(path: str, split_name: str = "train") -> list[PromptRow]:
    """Load every row of a verl-layout `.parquet`, `.jsonl` or `.json` file."""
    if not os.path.exists(path):
        raise DataError(f"data file not found: {path} (check data.train_files / data.val_files)")
    records = _read_records(path)
    rows = [row_from_record(rec, path, i, split_name) for i, rec in enumerate(records)]
    _check_unique_uids(rows, path)
    return rows


def _read_records(path: str) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        return _read_parquet(path)
    if path.endswith(".jsonl"):
        return _read_jsonl(path)
    if path.endswith(".json"):
        return _read_json(path)
    raise DataError(f"{path}: unsupported data file type (expected {', '.join(SUPPORTED_SUFFIXES)})")


def _read_parquet(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: cannot read parquet file: {exc}") from exc
    for column in ("data_source", "prompt", "reward_model"):
        if column not in table.column_names:
            raise DataError(f"{path}: missing column '{column}' (have {table.column_names})")
    records: list[dict[str, Any]] = table.to_pylist()
    return records


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path} row {len(records)} (0-based, line {line_no})"
            line = _utf8(raw, where)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON: {exc}") from exc
            records.append(_json_object(rec, where))
    return records


def _utf8(raw: bytes, where: str) -> str:
    """The text of `raw`, or a DataError naming where its bytes are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}); "
                        f"re-encode the file as UTF-8") from None


def _read_json(path: str) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        text = _utf8(f.read(), path)
    if not text.lstrip().startswith("["):
        return _read_jsonl(path)  # JSON lines under a .json name
    try:
        array = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON: {exc}") from exc
    return [_json_object(rec, f"{path} row {i} (0-based)") for i, rec in enumerate(array)]


def _json_object(rec: Any, where: str) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return rec


def row_from_record(rec: dict[str, Any], path: str, index: int, split_name: str = "train") -> PromptRow:
    """Check one raw record (row `index` of file `path`) and turn it into a `PromptRow`; a malformed
    field raises `DataError` naming the file, the row and the field."""
    where = f"{path} row {index} (0-based)"
    data_source = rec.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise DataError(f"{where}: field 'data_source' must be a non-empty str, got {_tname(data_source)}")
    prompt = rec.get("prompt")
    if isinstance(prompt, bytes):  # a parquet binary column: text if it is UTF-8
        prompt = _utf8(prompt, f"{where}: field 'prompt'")
    text = prompt if isinstance(prompt, str) and prompt else ""
    messages = () if text else _messages(prompt, where)
    ability = rec.get("ability") or ""
    if not isinstance(ability, str):
        raise DataError(f"{where}: field 'ability' must be a str, got {_tname(ability)}")
    extra_info = _extra_info(rec.get("extra_info"), where)
    uid_index = extra_info.get("index", index)
    return PromptRow(
        uid=f"{split_name}-{uid_index}",
        data_source=data_source,
        messages=messages,
        ground_truth=_ground_truth(rec.get("reward_model"), where),
        ability=ability,
        extra_info=extra_info,
        text=text,
    )


def _messages(prompt: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(prompt, list) or not prompt:
        got = "an empty list" if prompt == [] else _tname(prompt)
        raise DataError(f"{where}: field 'prompt' {_MESSAGES_HINT}, got {got}")
    messages = []
    for j, msg in enumerate(prompt):
        ok = isinstance(msg, dict) and isinstance(msg.get("role"), str)
        if not ok or not isinstance(msg.get("content"), str):
            raise DataError(f"{where}: field 'prompt[{j}]' {_MESSAGES_HINT}, got {_describe(msg)}")
        messages.append({"role": msg["role"], "content": msg["content"]})
    return tuple(messages)


def _ground_truth(reward_model: Any, where: str) -> str:
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DataError(
            f"{where}: field 'reward_model.ground_truth' is missing "
            f"(reward_model must be a dict with a 'ground_truth' key, got {_describe(reward_model)})"
        )
    truth = reward_model["ground_truth"]
    if isinstance(truth, str):
        return truth
    if isinstance(truth, (bool, int, float)):
        return str(truth)
    if isinstance(truth, (list, tuple, dict)):
        return json.dumps(truth)
    raise DataError(f"{where}: field 'reward_model.ground_truth' has unsupported type {_tname(truth)}")


def _extra_info(extra: Any, where: str) -> dict[str, Any]:
    if extra is None:
        return {}
    if isinstance(extra, list) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in extra):
        extra = dict(extra)  # a parquet map<str, ...> column arrives as (key, value) pairs
    if not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be a dict, got {_tname(extra)}")
    return {k: v for k, v in extra.items() if v is not None}


def _check_unique_uids(rows: list[PromptRow], path: str) -> None:
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.uid in seen:
            raise DataError(
                f"{path} row {i} (0-based): field 'extra_info.index' repeats uid '{row.uid}' "
                f"of row {seen[row.uid]}; indices must be unique within a file"
            )
        seen[row.uid] = i


def check_prompt_lengths(lengths_N: Sequence[int], max_prompt_length: int, source: str,
                         log: Callable[[str], None]) -> int:
    """Count the prompts of `source` longer than `data.max_prompt_length` (they are dropped): an error
    naming the key when that is every prompt, a one-line warning when it is some. Returns the count.

    Example: lengths [212, 90, 30] with max 64 in "train.parquet" logs "warning:
    data.max_prompt_length=64 drops 2 of 3 prompts in train.parquet (longest 212 tokens); ..." and
    returns 2.
    """
    n_dropped = sum(n > max_prompt_length for n in lengths_N)
    if not n_dropped:
        return 0
    what = (f"data.max_prompt_length={max_prompt_length} drops {n_dropped} of {len(lengths_N)} prompts in "
            f"{source} (longest {max(lengths_N)} tokens)")
    if n_dropped == len(lengths_N):
        raise ConfigError(f"{what}; raise data.max_prompt_length")
    log(f"warning: {what}; raise data.max_prompt_length to keep them")
    return n_dropped


def fit_prompts(rows: Sequence[PromptRow], max_prompt_length: int, source: str, log: Callable[[str], None], *,
                filter_overlong: bool = True, truncation: str = "error") -> list[PromptRow]:
    """The tokenized rows of `source` within `data.max_prompt_length`: the longer ones dropped and
    reported as `check_prompt_lengths` does (`data.filter_overlong_prompts`), else cut as
    `data.truncation` says (verl's modes: left keeps the end, right the start, middle both ends)
    and counted in one warning, or the first one an error naming the keys.

    Example: ids (1..6), max 4: left -> (3, 4, 5, 6), right -> (1, 2, 3, 4), middle -> (1, 2, 5, 6)."""
    assert all(r.prompt_ids for r in rows), "tokenize the rows first"
    if filter_overlong:
        check_prompt_lengths([len(r.prompt_ids) for r in rows], max_prompt_length, source, log)
        return [r for r in rows if len(r.prompt_ids) <= max_prompt_length]
    long = [r for r in rows if len(r.prompt_ids) > max_prompt_length]
    if long and truncation == "error":
        raise DataError(f"{source}: prompt '{long[0].uid}' has {len(long[0].prompt_ids)} tokens > "
                        f"data.max_prompt_length={max_prompt_length}; raise it, set data.filter_overlong_prompts=true "
                        f"to drop such prompts, or data.truncation=left|right|middle to cut them")
    if long:
        log(f"warning: data.truncation={truncation} cuts {len(long)} of {len(rows)} prompts in {source} to "
            f"data.max_prompt_length={max_prompt_length} tokens (longest {max(len(r.prompt_ids) for r in long)})")
    return [dataclasses.replace(r, prompt_ids=cut(r.prompt_ids, max_prompt_length, truncation)) for r in rows]


def cut(ids: tuple[int, ...], limit: int, truncation: str) -> tuple[int, ...]:
    """`ids` within `limit` tokens, cut as `truncation` says (see `fit_prompts`)."""
    if len(ids) <= limit:
        return ids
    if truncation == "left":
        return ids[len(ids) - limit:]
    if truncation == "right":
        return ids[:limit]
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head):]


def _tname(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"dict with keys {sorted(value)}"
    return _tname(value)


# ---------------------------------------------------------------------------------------------
# Writing (the inverse of load_rows; used by the built-in tasks and by tests)


def _to_record(row: PromptRow) -> dict[str, Any]:
    return {
        "data_source": row.data_source,
        "prompt": row.text or [{"role": m["role"], "content": m["content"]} for m in row.messages],
        "ability": row.ability,
        "reward_model": {"ground_truth": row.ground_truth, "style": "rule"},
        "extra_info": dict(row.extra_info),
    }


def write_parquet(rows: list[PromptRow], path: str) -> None:
    """Write rows in the verl parquet layout (`extra_info` as a struct column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _make_parent(path)
    records = [_to_record(r) for r in rows]
    if all(not rec["extra_info"] for rec in records):
        for rec in records:
            rec["extra_info"] = None  # an empty struct type is not writable
    pq.write_table(pa.Table.from_pylist(records), path)


def write_jsonl(rows: list[PromptRow], path: str) -> None:
    """Write rows as JSONL, one verl-layout object per line."""
    _make_parent(path)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(_to_record(row)) + "\n")


def _make_parent(path: str) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
