"""The `http` backend: SandboxFusion's `/run_code` API (stdlib urllib, no extra dependency).

Request: POST JSON {"code", "language": "python", "stdin", "run_timeout", "memory_limit_MB"} to
`sandbox.url`. Response: {"status": "Success"|"Failed"|"SandboxError", "run_result": {"status":
"Finished"|"TimeLimitExceeded"|"Error", "stdout", "stderr", "return_code", "execution_time"}}.
What it contains is the service's business (SandboxFusion `lite`: overlayfs, netns, cgroups).
Here: the HTTP call has a deadline (run_timeout + 10 s), output past `sandbox.max_output_kb` fails
the run, and a service error is a "sandbox_error" result. Per-step deadlines are not enforced
remotely (one request per run): only `timeout_s`, and `step_s` stays empty.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.sandbox.base import RunResult, RunStatus

HTTP_SLACK_S = 10.0


class HttpSandbox:
    name = "http"

    def __init__(self, cfg: SandboxConfig) -> None:
        assert cfg.url, "sandbox.backend=http needs sandbox.url"
        self.cfg = cfg

    def run(self, program: str, stdin: str, timeout_s: float, *, marker: str = "",
            step_timeouts_s: Sequence[float] = ()) -> RunResult:
        body = json.dumps({"code": program, "language": "python", "stdin": stdin, "run_timeout": timeout_s,
                           "memory_limit_MB": self.cfg.memory_mb}).encode()
        request = urllib.request.Request(self.cfg.url, body, {"Content-Type": "application/json"})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout_s + HTTP_SLACK_S) as response:
                reply = json.loads(response.read(self.cfg.max_output_kb * 4096 + 65536))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return RunResult("sandbox_error", stderr=f"sandbox.url={self.cfg.url}: {exc}",
                             wall_s=time.monotonic() - start)
        return self._result(reply, time.monotonic() - start)

    def _result(self, reply: Any, wall_s: float) -> RunResult:
        run = reply.get("run_result") if isinstance(reply, dict) else None
        if not isinstance(run, dict) or reply.get("status") == "SandboxError":
            return RunResult("sandbox_error", stderr=f"sandbox.url={self.cfg.url} answered {str(reply)[:300]}",
                             wall_s=wall_s)
        stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
        status: RunStatus = "timeout" if run.get("status") == "TimeLimitExceeded" else "ok"
        cap = self.cfg.max_output_kb * 1024
        if len(stdout.encode()) + len(stderr.encode()) > cap:
            status, stdout, stderr = "output_limit", stdout[:cap], stderr[:cap]
        code = run.get("return_code")
        return RunResult(status, stdout, stderr, code if isinstance(code, int) else None, wall_s)
