"""A rendered unit run by real systemd: every argument and variable arrives exactly as it was meant."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agent.host.secrets import env_file_text
from agent.protocol.common import secret_path
from agent.render import effective_flags, render_unit, secret_values, template_dir
from agent.sglang.flags import flag_words
from tests.pure.test_render import GOLDEN, case_inputs
from tests.testhost import TestHost

pytestmark = pytest.mark.integration

UNIT = "dctl-render.service"
# Stands in for SGLang: writes the argv and environment it was started with, then exits 0.
DUMP = (
    "import json, os, sys\n"
    "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open('/run/dctl-render.json', 'w'))\n"
)


def _run_unit(host: TestHost, text: str) -> dict[str, Any]:
    host.put("/usr/local/bin/dctl-dump.py", DUMP.encode(), 0o755)
    host.put(f"/etc/systemd/system/{UNIT}", text.encode())
    out = host.root / "run/dctl-render.json"
    out.unlink(missing_ok=True)
    try:
        result = host.ssh(["sh", "-c", f"systemctl daemon-reload && systemctl start {UNIT}"])
        assert result.returncode == 0, result.stderr.decode()
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        data: dict[str, Any] = json.loads(out.read_text())
        shown = host.ssh(["systemctl", "show", "-p", "Description", "--value", UNIT])
        data["description"] = shown.stdout.decode().strip()
        return data
    finally:
        host.ssh(["sh", "-c", f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}; true"])
        (host.root / f"etc/systemd/system/{UNIT}").unlink(missing_ok=True)
        host.ssh(["systemctl", "daemon-reload"])


def test_systemd_passes_every_word_of_the_quoting_case(testhost: TestHost) -> None:
    host, flags = case_inputs(GOLDEN / "quoting.json")
    host = host.model_copy(
        update={
            "unit": host.unit.model_copy(update={"user": None, "name": UNIT}),
            "sglang": host.sglang.model_copy(
                update={"executable": ["/usr/bin/python3", "/usr/local/bin/dctl-dump.py"]}
            ),
        }
    )
    # The secret variables come from the root-only file the agent writes, in its own quoting.
    env, _ = secret_values(host, flags)
    text = env_file_text(env)
    assert text is not None
    testhost.put(secret_path(host.unit.secrets_directory, UNIT, "env"), text.encode(), 0o600)
    seen = _run_unit(testhost, render_unit(host, flags, template_dir()))
    expected_argv = [w for k, v in effective_flags(host, flags).items() for w in flag_words(k, v)]
    assert seen["argv"] == expected_argv
    assert 'kimi "prod" $1' in seen["argv"] and "/models/Kimi K2.6" in seen["argv"]
    for name, value in host.unit.environment.items():
        assert seen["env"][name] == value
    assert seen["description"] == host.unit.description
