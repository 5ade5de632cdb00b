"""Pull the answer out of a response: last number, last `\\boxed{}`, `<answer>` tag, code block.

Pure string functions shared by the scorers; no scoring and no judgement of correctness here.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")
_INTEGER = re.compile(r"(?<!\d)-?\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CODE_BLOCK = re.compile(r"```(\w*)[ \t]*\n(.*?)```", re.DOTALL)


def last_number(text: str) -> str | None:
    """The last decimal number, commas removed: "it costs 1,234.5 dollars" -> "1234.5"."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def first_number(text: str) -> str | None:
    """The first decimal number, commas removed: "#### 72 dollars" -> "72"."""
    found = _NUMBER.search(text)
    return found.group().replace(",", "") if found else None


def last_integer(text: str) -> int | None:
    """The last integer, a leading '-' counting only when not preceded by a digit.

    Example: "8-3=5" -> 5; "it is -7." -> -7; "12-4" -> 4.
    """
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>`, stripped; None if absent."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def code_block(text: str) -> str:
    """The last ```python block, else the last ``` block of any language, else the whole text."""
    blocks = _CODE_BLOCK.findall(text)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else text


def to_number(text: str) -> float | None:
    """Parse "1,234", "-3.50", "$12" as a float; None if it is not a plain number."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None
