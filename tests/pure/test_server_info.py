"""The gate's check of /server_info against the rendered flags (field names from SGLang 0.5.23)."""

from __future__ import annotations

from agent.host.watch.serverinfo import verdict

# A slice of what SGLang 0.5.23's /server_info answers (server_args resolved_dict + scheduler info).
INFO = {
    "context_length": 200000,
    "mem_fraction_static": 0.929,
    "max_running_requests": 32,
    "max_total_num_tokens": 204141,
    "version": "0.5.23",
}
FLAGS = {"context-length": "200000", "mem-fraction-static": "0.929", "max-running-requests": "32"}


def test_a_server_running_the_rendered_values_passes() -> None:
    assert verdict(FLAGS, INFO) is None
    assert verdict({**FLAGS, "context-length": "200k"}, INFO) is None  # SGLang reads 200k as 200000
    assert verdict({"tp-size": "8"}, INFO) is None  # only what the unit sets is compared


def test_each_mismatch_is_named_with_both_values() -> None:
    reason = verdict({**FLAGS, "context-length": "262144", "max-running-requests": "64"}, INFO)
    assert reason == (
        "the server does not run the rendered unit: --context-length 262144 in the unit, /server_info "
        "context_length=200000; --max-running-requests 64 in the unit, /server_info max_running_requests=32"
    )


def test_a_missing_field_is_a_mismatch() -> None:
    reason = verdict(FLAGS, {k: v for k, v in INFO.items() if k != "mem_fraction_static"})
    assert reason is not None and "/server_info mem_fraction_static=missing" in reason
