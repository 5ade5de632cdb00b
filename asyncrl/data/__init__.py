"""Prompt data: verl-layout parquet/JSONL loading, chat-template tokenization, an endless
resumable prompt iterator, and built-in generated tasks (arithmetic, countdown, code, longtail)."""

from asyncrl.data.dataset import load_rows, write_jsonl, write_parquet
from asyncrl.data.iterator import PromptIterator
from asyncrl.data.tasks import TASKS, make_task
from asyncrl.data.tokenization import tokenize_rows

__all__ = ["TASKS", "PromptIterator", "load_rows", "make_task", "tokenize_rows", "write_jsonl", "write_parquet"]
