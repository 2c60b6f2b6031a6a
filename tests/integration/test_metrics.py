"""Metrics for alerting, read back through the real node_exporter's textfile collector on the test host."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import pytest

from agent.exitcodes import ExitCode
from agent.protocol.common import unit_sha256
from tests import faultkit as fk
from tests.integration.conftest import cli, variant, wait_pool
from tests.integration.test_faults import apply, base
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration
__all__ = ["base"]

TEXTFILES = "/var/lib/prometheus/node-exporter"
SAMPLE = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)")
LABEL = re.compile(r'(\w+)="((?:\\.|[^"\\])*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def exporter(sim) -> Iterator[int]:
    """node_exporter with only its textfile collector, on a port of this test's own."""
    (port,) = free_ports(1)
    fk.sh(sim, "mkdir", "-p", TEXTFILES)
    fk.sh(
        sim,
        "systemd-run",
        "--unit=dctl-node-exporter",
        "--collect",
        "/usr/bin/prometheus-node-exporter",
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
        "--collector.textfile",
        f"--collector.textfile.directory={TEXTFILES}",
    )
    try:
        yield port
    finally:
        fk.sh(sim, "systemctl", "stop", "dctl-node-exporter.service")


def scrape(port: int) -> Samples:
    deadline = time.monotonic() + 30
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            break
        except OSError:
            assert time.monotonic() < deadline, "node_exporter never answered"
            time.sleep(0.2)
    return parse(text)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for line in text.splitlines():
        m = SAMPLE.fullmatch(line)
        if m and not line.startswith("#"):
            labels = frozenset(LABEL.findall(m["labels"] or ""))
            samples[(m["name"], labels)] = float(m["value"])
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    ours = {"host": "ct200-sim", "unit": "sglang.service"} if name.startswith("deployctl_") else {}
    want = {**ours, **labels}
    found = [v for (n, ls), v in samples.items() if n == name and want.items() <= dict(ls).items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_each_run_is_scraped_by_node_exporter(sim, base, exporter):
    _, old_pool = base
    started = time.time()
    r = apply(sim)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    m = scrape(exporter)
    assert value(m, "node_textfile_scrape_error") == 0  # the file parsed: no half-written or bad line
    assert value(m, "deployctl_last_run_outcome", outcome="applied") == 1
    assert value(m, "deployctl_last_run_outcome", outcome="rolled_back") == 0
    assert value(m, "deployctl_last_run_exit_code") == 0
    assert value(m, "deployctl_kv_pool_tokens") == wait_pool(sim) >= 200_000
    assert value(m, "deployctl_target_context_tokens") == 200_000
    assert value(m, "deployctl_predicted_pool_tokens") >= 200_000
    assert value(m, "deployctl_rollbacks_total") == 0
    success = value(m, "deployctl_last_success_timestamp_seconds")
    assert started - 1 <= success <= time.time() + 1
    assert 0 < value(m, "deployctl_restart_downtime_seconds") < 120
    assert value(m, "deployctl_phase_seconds", phase="watch") > 0
    assert value(m, "deployctl_downtime_phase_seconds", phase="weights") > 0  # from the start's own lines
    assert value(m, "deployctl_unit_info", sha256=unit_sha256(sim.unit_text())) == 1
    applied_pool = value(m, "deployctl_kv_pool_tokens")

    r = apply(sim, "400k", "--force", "--allow-longer-context")  # the pool falls short: rolled back
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    m = scrape(exporter)
    assert value(m, "deployctl_last_run_outcome", outcome="rolled_back") == 1
    assert value(m, "deployctl_last_run_exit_code") == ExitCode.ROLLED_BACK
    assert value(m, "deployctl_rollbacks_total") == 1
    assert value(m, "deployctl_last_success_timestamp_seconds") == success  # a failure never counts
    assert value(m, "deployctl_kv_pool_tokens") == applied_pool  # the restored start's own pool
    assert value(m, "deployctl_target_context_tokens") == 400_000

    r = apply(sim)  # nothing to do: still a successful run
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    m = scrape(exporter)
    assert value(m, "deployctl_last_run_outcome", outcome="up_to_date") == 1
    assert value(m, "deployctl_last_success_timestamp_seconds") > success
    assert value(m, "deployctl_rollbacks_total") == 1
    assert value(m, "deployctl_kv_pool_tokens") == applied_pool  # the running start's, kept from before
    assert old_pool < applied_pool


def test_metrics_that_cannot_be_written_never_change_the_outcome(sim, base):
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    text += '\n[metrics]\npath = "/etc/hostname/deployctl.prom"\n'  # its folder is a file: mkdir fails
    r = cli(variant(sim, "ct200-nometrics", text), "apply", "ct200-nometrics", "--context", "200k", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert "metrics not written to /etc/hostname/deployctl.prom" in r.stdout + r.stderr
