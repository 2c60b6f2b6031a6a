"""Ansible callback: one JSON line per task start, success, retry and failure, with wall-clock times."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase  # type: ignore[import-not-found]


class CallbackModule(CallbackBase):  # type: ignore[misc]
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get("DEPLOYCTL_BENCH_TIMES", os.devnull)

    def _write(self, kind: str, task: Any) -> None:
        with open(self._path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"t": time.time(), "kind": kind, "task": task.get_name()}) + "\n")

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._write("start", task)

    def v2_runner_on_ok(self, result: Any, **kwargs: Any) -> None:
        self._write("ok", result._task)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._write("failed", result._task)

    def v2_runner_retry(self, result: Any) -> None:
        self._write("retry", result._task)
