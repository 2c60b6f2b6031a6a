"""An SRE's first half hour splitting one model into prefill and decode with `[pd]`, from README.md,
docs/pd.md, docs/commands.md and each command's --help alone. Each test states what should hold and is
marked xfail(strict) while it does not. Pure: the shipped example edited, the CLI in-process, no host."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import EXAMPLE, ROOT

REAL_DECODE_LOG = ROOT / "tests" / "data" / "realpd" / "decode-page-size-mismatch.log"
MISMATCH_LINE = "RuntimeError: Page size mismatch: prefill server has page_size=1"


def _cli(units: Path | None, *argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    extra = ["--units", str(units)] if units is not None else []
    code = main([*argv, *extra], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def _inventory(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "pd.toml").write_text(text, encoding="utf-8")
    return tmp_path


DECODE_FLAGS = "flags = { tp-size = 1, max-running-requests = 8 }"
SWITCHABLE_DECODE = (
    "bootstrap_port = 8999\nflags = { tp-size = 1, max-running-requests = 8, enable-pd-role-switch = true }"
)


def _pd_log(tmp_path: Path, line: str) -> Path:
    """The real 0.5.23 decode journal (tests/data/realpd) with its fatal line swapped for `line`."""
    text = REAL_DECODE_LOG.read_text(encoding="utf-8")
    fatal = next(ln for ln in text.splitlines() if ln.startswith(MISMATCH_LINE))
    path = tmp_path / "decode.log"
    path.write_text(text.replace(fatal, line), encoding="utf-8")
    return path


def _failure(stdout: str) -> str:
    return next(ln.split(":", 1)[1].strip() for ln in stdout.splitlines() if ln.startswith("failure:"))


# ---- medium: a message (and a doc) that contradicts the documented rollback


def test_rollback_to_refusal_describes_the_one_generation_rollback() -> None:
    """`deployctl rollback pd-1p1d --to x --yes`: pd.md's 'Dry run, status, rollback' says the rollback
    takes the service back one generation, 'Never each unit's newest backup on its own'. The refusal says
    '... takes each unit back to its newest backup that differs from its unit', as commands.md does."""
    code, _, err = _cli(ROOT / "units", "rollback", "pd-1p1d", "--to", "x", "--yes")
    assert code == 2  # holds today
    commands_md = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert "newest backup that differs" not in err, err
    assert "newest backup that differs" not in commands_md


# ---- medium: a decode SGLang refuses at its start, planned


def test_a_decodes_radix_cache_with_ngram_speculation_is_refused(tmp_path: Path) -> None:
    """`deployctl plan pd --offline --context 32k`, the decode's flags adding
    disaggregation-decode-enable-radix-cache = true and speculative-algorithm = "NGRAM": SGLang 0.5.23
    raises '--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding' for any
    algorithm but DSPARK, EAGLE and EAGLE3. deployctl refuses the radix cache with HiSparse (:99-109) but
    plans this one."""
    flags = DECODE_FLAGS.replace(
        " }", ', disaggregation-decode-enable-radix-cache = true, speculative-algorithm = "NGRAM" }'
    )
    code, _, err = _cli(
        _inventory(tmp_path, (DECODE_FLAGS, flags)), "plan", "pd", "--offline", "--context", "32k"
    )
    assert code == 2 and "speculative" in err, (code, err)


# ---- medium: advice that leads into the next refusal


def test_a_context_above_the_models_own_is_named_before_the_decodes_count(tmp_path: Path) -> None:
    """`deployctl plan pd-1p1d --offline --context 200k` (max_context 131072): exit 2 with 'lower its
    max-running-requests to 2, the context, or add a decode'. With 2, the plan says NOT FEASIBLE: SGLang
    refuses a context of 200,000 above the model's own 131,072 (exit 8). The first answer should name it."""
    units = _inventory(tmp_path)
    code, _, err = _cli(units, "plan", "pd", "--offline", "--context", "200k")
    assert code == 2  # holds today
    assert "131,072" in err or "131072" in err, err


def test_render_at_a_context_above_the_models_own_says_so(tmp_path: Path) -> None:
    """`deployctl render pd --context 200k` with the decode at 2 requests (so its pool holds): every role
    unit gets --context-length 200000 without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN; SGLang refuses
    such a start. pd.md: 'render runs every refusal plan runs'. A refusal or at least a note is due."""
    units = _inventory(tmp_path, (DECODE_FLAGS, DECODE_FLAGS.replace("= 8", "= 2")))
    assert _cli(units, "plan", "pd", "--offline", "--context", "200k")[0] == 8  # holds today
    code, out, err = _cli(units, "render", "pd", "--context", "200k")
    assert "--context-length 200000" in out  # holds today
    assert code != 0 or "131,072" in err or "131072" in err, err


# ---- low: JSON that says less than the unit


def test_plan_json_gives_a_switchable_decodes_bootstrap_port(tmp_path: Path) -> None:
    """`deployctl plan pd --offline --context 32k --json`, the decode with enable-pd-role-switch and
    bootstrap_port = 8999 (docs/pd.md 'Role switch'): render writes its --disaggregation-bootstrap-port
    8999; the JSON's 'bootstrap port' (pd.md: '--json prints ... bootstrap port') says null."""
    units = _inventory(tmp_path, (DECODE_FLAGS, SWITCHABLE_DECODE))
    code, out, _ = _cli(units, "render", "pd", "--context", "32k")
    assert code == 0 and "--disaggregation-bootstrap-port 8999" in out  # holds today
    code, out, _ = _cli(units, "plan", "pd", "--offline", "--context", "32k", "--json")
    assert code == 0  # holds today
    decode = next(r for r in json.loads(out)["roles"] if r["role"] == "decode")
    assert decode["bootstrap_port"] == 8999, decode["bootstrap_port"]


# ---- low: a switch that can never happen, accepted silently


def test_a_role_switch_unit_on_nixl_is_told_it_can_never_switch(tmp_path: Path) -> None:
    """`deployctl plan pd --offline --context 32k`, transfer_backend = "nixl" and a decode with
    enable-pd-role-switch: SGLang's role_switch.py:206 rejects every switch ('transfer backend 'nixl' does
    not support runtime role switch'). The plan (or a refusal) should say so; it says nothing."""
    units = _inventory(
        tmp_path,
        ('transfer_backend = "mooncake"', 'transfer_backend = "nixl"'),
        (DECODE_FLAGS, SWITCHABLE_DECODE),
    )
    code, out, err = _cli(units, "plan", "pd", "--offline", "--context", "32k")
    assert code in (0, 2)  # holds today
    assert re.search(r"(?i)switch", out + err), out + err


# ---- low: parse-log of SGLang's own PD failure lines


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: Prefill/Decode Mamba slot size mismatch (src=1024, dst=2048). Configure matching "
        "persistent state layouts on both peers.",
        "RuntimeError: PD KV layout mismatch on the whole-envelope path: prefill has 1 KV region(s) with "
        "item_lens=[4096], decode has 1 with item_len=2048. With --enable-unified-memory both sides must "
        "enable it and use the same page size and model spec.",
        "RuntimeError: --enable-unified-memory does not support different prefill / decode attention TP "
        "sizes (prefill=4, decode=8): the whole-envelope state cannot be TP-resliced.",
    ],
)
def test_parse_log_names_mooncakes_own_pd_layout_refusals(tmp_path: Path, line: str) -> None:
    """`deployctl parse-log decode.log`, the real decode journal with its fatal line one of SGLang 0.5.23's
    Mooncake PD refusals: 'failure: scheduler_exception' and no fix. Expected a pd_* kind and a fix."""
    code, out, _ = _cli(None, "parse-log", str(_pd_log(tmp_path, line)))
    assert code == 0 and line in out  # holds today
    assert _failure(out).startswith("pd_"), _failure(out)
    assert "what to do:" in out


def test_parse_log_of_the_pd_hooks_start_refusal_is_not_a_scheduler_exception(tmp_path: Path) -> None:
    """`deployctl parse-log role-switch.log`: a start that died in prepare_server_args with the role-switch
    ValueError. It reports 'failure: scheduler_exception' and nothing to do."""
    log = tmp_path / "role-switch.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/sglang/.venv/lib/python3.11/site-packages/sglang/srt/arg_groups/'
        'pd_disaggregation_hook.py", line 192, in handle_pd_disaggregation\n'
        "    raise ValueError(\n"
        "ValueError: --enable-pd-role-switch does not rebuild role-specific state for the following "
        "features: expert parallelism (--ep-size 4). Remove these options or drop --enable-pd-role-switch.\n",
        encoding="utf-8",
    )
    code, out, _ = _cli(None, "parse-log", str(log))
    assert code == 0 and "ValueError: --enable-pd-role-switch" in out  # holds today
    assert _failure(out) != "scheduler_exception" and "what to do:" in out, out


# ---- low: options that mean nothing for a [pd] file, accepted silently


def test_plan_of_a_pd_file_refuses_start_as_a_plain_file_does(tmp_path: Path) -> None:
    """`deployctl plan pd-1p1d --offline --context 32k --start 2`: exit 0, the option ignored."""
    code, _, err = _cli(ROOT / "units", "plan", "pd-1p1d", "--offline", "--context", "32k", "--start", "2")
    assert code == 2 and "--start" in err, (code, err)


def test_a_path_to_the_inventory_file_is_answered_with_its_stem() -> None:
    """A newcomer types the file they just read: `deployctl plan units/pd-1p1d.toml --offline --context
    32k`. The error should name what to type instead: `pd-1p1d`."""
    code, _, err = _cli(ROOT / "units", "plan", "units/pd-1p1d.toml", "--offline", "--context", "32k")
    assert code == 2  # holds today
    assert "deployctl plan pd-1p1d" in err or "'pd-1p1d'" in err, err
