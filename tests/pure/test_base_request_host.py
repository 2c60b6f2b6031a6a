"""Which address the host agent probes for each address SGLang is bound to."""

from __future__ import annotations

from typing import Any

import pytest

from agent.inventory import HostConfig
from agent.remote.client import base_request

HOST: dict[str, Any] = {
    "name": "h",
    "ssh": {"target": "h"},
    "gpus": {"count": 1, "memory_gib": 80},
    "model": {
        "path": "/models/m",
        "attention": "mla",
        "layers": 2,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "dtype_bytes": 2,
        "weights_gib_per_gpu": 10,
        "max_context": 4096,
    },
}


@pytest.mark.parametrize(
    ("bound", "probed"),
    [
        ("0.0.0.0", "127.0.0.1"),  # IPv4 wildcard: IPv4 loopback
        ("::", "::1"),  # IPv6 wildcard: ::1 answers whether or not the socket also takes IPv4
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("10.0.0.5", "10.0.0.5"),
        ("fd00::5", "fd00::5"),
    ],
)
def test_probe_address_for_the_bind_address(bound: str, probed: str) -> None:
    host = HostConfig.model_validate({**HOST, "sglang": {"host": bound}})
    assert base_request(host, "status").http_host == probed
