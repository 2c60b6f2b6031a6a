"""A newcomer's first hour with a [pd] service, offline: each test states what should hold and is marked
xfail(strict) while it does not. Pure: the shipped example edited, the CLI in-process, no host."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import EXAMPLE, ROOT
from tests.pure.test_pd_newcomer import refusals

REAL_DECODE_LOG = ROOT / "tests" / "data" / "realpd" / "decode-page-size-mismatch.log"


def _cli(units: Path, *argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*argv, "--units", str(units)], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def _inventory(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "pd.toml").write_text(text, encoding="utf-8")
    return tmp_path


# ---- medium: a plan SGLang's own rules contradict


def test_prefill_complete_with_attention_tp_above_one_is_refused() -> None:
    # srt/arg_groups/pd_disaggregation_hook.py:199-210: prefill_complete needs tp_size == attention DP size
    # ("does not yet support attention tensor parallelism greater than one"): both roles die at their start
    def mutate(d: dict[str, Any]) -> None:
        d["gpus"]["indices"] = [0, 1, 2, 3]
        d["sglang"]["flags"]["disaggregation-decode-allocation-policy"] = "prefill_complete"
        d["pd"]["prefill"][0].update(gpus=[0, 1])
        d["pd"]["prefill"][0]["flags"]["tp-size"] = 2
        d["pd"]["decode"][0].update(gpus=[2, 3])
        d["pd"]["decode"][0]["flags"]["tp-size"] = 2

    said = refusals(mutate)
    assert any("prefill_complete" in s for s in said), said


def test_decode_host_receive_with_a_cpu_tensor_backup_is_refused() -> None:
    # srt/arg_groups/pd_disaggregation_hook.py:70-75: "Decode host KV buffering requires host_pool retraction"
    def mutate(d: dict[str, Any]) -> None:
        d["pd"]["decode"][0]["flags"].update(
            {
                "disaggregation-decode-host-receive-threshold": 0.5,
                "disaggregation-decode-retraction-backup": "cpu_tensor",
            }
        )

    said = refusals(mutate)
    assert any("host_pool" in s or "retraction" in s for s in said), said


def test_a_prefills_unset_chunk_is_planned_at_sglangs_default(tmp_path: Path) -> None:
    # srt/arg_groups/memory_hook.py:131-139: 60-90 GiB cards (H100) get chunked_prefill_size 8192 when unset
    units = _inventory(
        tmp_path,
        ("flags = { tp-size = 1, chunked-prefill-size = 8192 }", "flags = { tp-size = 1 }"),
    )
    code, out, err = _cli(units, "plan", "pd", "--offline", "--context", "32k", "--json")
    assert code == 0, err
    prefill = json.loads(out)["roles"][0]
    assert prefill["role"] == "prefill"
    assert prefill["need_tokens"] == 8192 + 2 * 32000, prefill["need"]


def test_render_refuses_a_decode_plan_refuses(tmp_path: Path) -> None:
    # docs/pd.md: the refusals (a decode whose pool cannot hold its max-running-requests among them) run
    # "before plan plans and before render renders"
    units = _inventory(tmp_path, ("max-running-requests = 8", "max-running-requests = 64"))
    plan_code, _, _ = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert plan_code == 2
    code, out, _ = _cli(units, "render", "pd", "--context", "32k")
    assert code == plan_code, out[:200]


def test_a_decode_with_no_pool_is_not_told_to_run_zero_requests(tmp_path: Path) -> None:
    # 80 GiB of weights per GPU on a 79.2 GiB card: SGLang cannot load them; 0 requests is no fix
    units = _inventory(tmp_path, ("weights_gib_per_gpu = 14.96", "weights_gib_per_gpu = 80.0"))
    code, _, err = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert code in (2, 8)
    assert "max-running-requests to 0" not in err, err


# ---- low: output that misleads


def test_render_of_a_pd_file_says_the_fraction_plan_chose_is_not_in_its_units() -> None:
    # a plain service's render notes "--context-length alone does not grow the KV pool"; a [pd] render
    # prints units at SGLang's default fraction, not the plan's 0.835 / 0.874, silently
    code, out, err = _cli(ROOT / "units", "render", "pd-1p1d", "--context", "32k")
    assert code == 0
    assert "--mem-fraction-static" in out or "mem-fraction-static" in err, err


def test_a_refused_set_names_only_what_was_typed(tmp_path: Path) -> None:
    code, _, err = _cli(
        ROOT / "units", "plan", "pd-1p1d", "--offline", "--context", "32k", "--set", "page-size=16"
    )
    assert code == 2
    assert "--max-running-requests" not in err, err


def test_the_routers_port_in_its_flags_points_at_pd_router_port(tmp_path: Path) -> None:
    units = _inventory(
        tmp_path, ('flags = { policy = "cache_aware" }', 'flags = { policy = "cache_aware", port = 31000 }')
    )
    code, _, err = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert code == 2
    assert "roles' units" not in err and re.search(r"pd\.router\]? ?\.?port", err), err


def test_parse_log_names_a_pd_kv_layout_mismatch(tmp_path: Path) -> None:
    # srt/disaggregation/common/conn.py:1348-1357: raised at the same handshake as the page-size mismatch
    text = re.sub(
        r"^RuntimeError: Page size mismatch.*$",
        "RuntimeError: KV layout mismatch: prefill server has kv_layout=nsa, but decode server has "
        "kv_layout=mla. Both servers must use the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT.",
        REAL_DECODE_LOG.read_text(encoding="utf-8"),
        flags=re.M,
    )
    log = tmp_path / "decode.log"
    log.write_text(text, encoding="utf-8")
    code, out, err = _cli(tmp_path, "parse-log", str(log), "--json")
    assert code == 0, err
    said = json.loads(out)
    assert said["failure"]["kind"].startswith("pd_") and said["fix"], said["failure"]


def test_readme_does_not_call_pd_status_rollback_backups_facts_unbuilt() -> None:
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if "docs/pd.md" in line)
    assert "not yet" not in row, row


def test_a_roles_page_size_zero_is_refused_as_a_bad_value(tmp_path: Path) -> None:
    # the same value in [sglang.flags] is refused as "--page-size '0' must be >= 1"
    units = _inventory(
        tmp_path,
        ("tp-size = 1, max-running-requests = 8", "tp-size = 1, page-size = 0, max-running-requests = 8"),
    )
    code, _, err = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert code == 2
    assert "unset" not in err and ">= 1" in err, err


def test_a_decodes_non_numeric_request_cap_is_refused_as_not_a_number(tmp_path: Path) -> None:
    units = _inventory(tmp_path, ("max-running-requests = 8", 'max-running-requests = "eight"'))
    code, _, err = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert code == 2
    assert "required" not in err and "eight" in err, err


def test_commands_md_says_which_options_a_pd_file_refuses() -> None:
    # plan/render refuse --from-log, --diff, --set (but mem-fraction-static), --max-running-requests for a
    # [pd] file; status --follow and rollback --to too: a newcomer reading commands.md learns none of it
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert "[pd]" in text or "pd.md" in text


def test_a_role_url_with_a_port_out_of_range_is_refused(tmp_path: Path) -> None:
    units = _inventory(tmp_path, ("gpus = [1]\n", 'gpus = [1]\nurl = "http://gpu-pd:99999"\n'))
    code, out, _ = _cli(units, "render", "pd", "--context", "32k")
    assert code == 2, [line for line in out.splitlines() if "--decode" in line]


def test_a_roles_bad_environment_name_is_named_by_its_own_key(tmp_path: Path) -> None:
    units = _inventory(tmp_path, ("gpus = [1]\n", 'gpus = [1]\nenvironment = { "A B" = "1" }\n'))
    code, _, err = _cli(units, "render", "pd", "--context", "32k")
    assert code == 2
    assert "pd.decode.0.environment" in err, err


def test_the_kv_checksum_line_says_it_is_skipped_between_different_tp_widths(tmp_path: Path) -> None:
    # srt/disaggregation/utils.py:263-284 signs the layout with its per-page item lengths (TP width for GQA);
    # decode.py:2580-2597 admits a prefill of another signature unverified ("KV checksum skipped")
    units = _inventory(
        tmp_path,
        ("indices = [0, 1]", "indices = [0, 1, 2]"),
        ("gpus = [1]", "gpus = [1, 2]"),
        (
            "flags = { tp-size = 1, max-running-requests = 8 }",
            "flags = { tp-size = 2, max-running-requests = 8 }",
        ),
    )
    code, out, err = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert code == 0, err
    line = next(s for s in out.splitlines() if s.startswith("KV checksum"))
    assert "skipped" in line or "unverified" in line, line
