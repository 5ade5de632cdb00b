"""The command line's stderr handler: plain lines, and each warning once."""

from __future__ import annotations

import logging

import pytest

from asyncrl.telemetry.logs import setup_logging


def test_a_warning_prints_once(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO")
    log = logging.getLogger("asyncrl.test")
    for _ in range(2):  # preflight and the run's loader find the same dropped prompts
        log.info("warning: data.max_prompt_length=8 drops 1 of 2 prompts in a.jsonl")
        log.warning("verl engine and memory knobs with no effect here, ignored: x")
        log.info("step 1/2: ...")
    assert capsys.readouterr().err.splitlines() == [
        "warning: data.max_prompt_length=8 drops 1 of 2 prompts in a.jsonl",
        "verl engine and memory knobs with no effect here, ignored: x", "step 1/2: ...", "step 1/2: ..."]
