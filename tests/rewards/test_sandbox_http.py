"""The http backend against a fake SandboxFusion `/run_code` server running inside the test."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.code_exec import code_score
from asyncrl.rewards.sandbox import SandboxError, make_sandbox

SEEN: list[dict[str, Any]] = []


class FakeSandboxFusion(BaseHTTPRequestHandler):
    """Runs the posted code in a plain subprocess (trusted test code) and answers in SandboxFusion's shape."""

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append(request)
        try:
            done = subprocess.run([sys.executable, "-I", "-c", request["code"]], input=request["stdin"], text=True,
                                  capture_output=True, timeout=request["run_timeout"])
            run = {"status": "Finished", "stdout": done.stdout, "stderr": done.stderr,
                   "return_code": done.returncode, "execution_time": 0.01}
        except subprocess.TimeoutExpired:
            run = {"status": "TimeLimitExceeded", "stdout": "", "stderr": "", "return_code": None}
        body = json.dumps({"status": "Success", "message": "", "run_result": run}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSandboxFusion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()
    server.server_close()


def test_run_sends_sandboxfusion_request_and_maps_the_answer(url: str) -> None:
    sandbox = make_sandbox(SandboxConfig(backend="http", url=url, memory_mb=256))
    result = sandbox.run("print(input()[::-1])", "abc\n", timeout_s=5.0)
    assert (result.status, result.stdout, result.exit_code) == ("ok", "cba\n", 0)
    assert {k: SEEN[-1][k] for k in ("language", "stdin", "run_timeout", "memory_limit_MB")} == \
        {"language": "python", "stdin": "abc\n", "run_timeout": 5.0, "memory_limit_MB": 256}
    assert sandbox.run("while True: pass", "", timeout_s=0.3).status == "timeout"


def test_output_cap_applies_to_the_answer(url: str) -> None:
    sandbox = make_sandbox(SandboxConfig(backend="http", url=url, max_output_kb=1))
    assert sandbox.run("print('x' * 5000)", "", timeout_s=5.0).status == "output_limit"


def test_code_scorer_over_http(url: str) -> None:
    sandbox = make_sandbox(SandboxConfig(backend="http", url=url))
    truth = json.dumps({"fn_name": "f", "tests": [{"input": [1], "output": 4}, {"input": [2], "output": 7}]})
    assert code_score("```python\ndef f(x):\n    return x*3+1\n```", truth, sandbox=sandbox)["score"] == 1.0
    assert code_score("```python\ndef f(x):\n    return 4\n```", truth, sandbox=sandbox)["score"] == 0.5


def test_service_down_is_a_sandbox_error_not_a_score() -> None:
    sandbox = make_sandbox(SandboxConfig(backend="http", url="http://127.0.0.1:9/run_code"))
    assert sandbox.run("print(1)", "", timeout_s=1.0).status == "sandbox_error"
    with pytest.raises(SandboxError, match="sandbox.url="):
        code_score("def f(x):\n    return 1", '["assert f(1) == 1"]', sandbox=sandbox)
