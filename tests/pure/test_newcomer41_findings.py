"""A newcomer's hour with the HiCache host-memory plan: `plan --facts` files written by hand.

A 256 GiB host (240 GiB available) with four H100s per service: Qwen3-32B (GQA) and DeepSeek-V2-Lite (MLA)
at TP 4. Each test states what SGLang 0.5.23's own rule (or deployctl's docs) would have the plan say,
and fails on what the plan says today. Every figure below was produced by `deployctl plan --facts`.
"""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from typing import Any

from agent.cli.main import main
from agent.output import Output

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0"}

# Qwen/Qwen3-32B config.json (64 layers, 8 KV heads of 128): 65,536 B per token per rank at TP 4
QWEN3_32B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "num_hidden_layers": 64,
    "hidden_size": 5120,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "intermediate_size": 25600,
    "vocab_size": 151936,
    "rope_theta": 1000000,
}

# deepseek-ai/DeepSeek-V2-Lite-Chat config.json (MLA: kv_lora_rank 512 + rope 64, 27 layers)
DSV2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "num_hidden_layers": 27,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "q_lora_rank": None,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "vocab_size": 102400,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
}


def host_memory(cgroup: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A 256 GiB host with 240 GiB available, as `deployctl facts --json` prints its host_memory."""
    return {"total": 256 * GIB, "available": 240 * GIB, "hugepages_total": 0, "hugepages_free": 0,
            "numa_nodes": 2, "cgroup": cgroup or [], "siblings": {}}  # fmt: skip


def facts(config: dict[str, Any], weights: int, flags: dict[str, Any], **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": "deployctl-facts/1",
        "gpus": [H100] * 4,
        "sglang": {"version": "0.5.23"},
        "model": {"config": copy.deepcopy(config), "weights_bytes": weights, "path": "/models/m"},
        "flags": {"tp-size": 4, "enable-hierarchical-cache": True, **flags},
        "env": {},
        "host_memory": host_memory(),
    }
    data.update(extra)
    return data


def qwen(**flags: Any) -> dict[str, Any]:
    return facts(QWEN3_32B, 65_535_924_224, flags)


def dsv2(**flags: Any) -> dict[str, Any]:
    return facts(DSV2_LITE, 31_000_000_000, {"trust-remote-code": True, **flags})


def run(tmp_path: Path, data: dict[str, Any], *argv: str) -> tuple[int, str, str]:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["plan", "--facts", str(path), "--context", "32k", *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def plan_json(tmp_path: Path, data: dict[str, Any], *argv: str) -> dict[str, Any]:
    code, stdout, stderr = run(tmp_path, data, "--json", *argv)
    assert code in (0, 8), stderr
    return json.loads(stdout)  # type: ignore[no-any-return]


# -- the size a refusal offers -------------------------------------------------------------------------


def test_the_size_a_ratio_refusal_offers_is_accepted_by_the_next_plan(tmp_path: Path) -> None:
    """MLA at ratio 2 on 240 GiB is refused with '--hicache-size 56 per rank would fit'; planning with
    56 is refused again ('14 per rank would fit'): four ranks pin 56 GB each, and the last one to check
    sees the other three pools as used (pool_host/base.py:248-257). A user who follows the hint must get
    a feasible plan."""
    refused = plan_json(tmp_path, dsv2(**{"hicache-ratio": 2}))
    assert refused["feasible"] is False
    offered = refused["host_budget"]["fitting_size_gb"]
    assert offered is not None
    again = plan_json(tmp_path, dsv2(**{"hicache-ratio": 2}), "--set", f"hicache-size={int(offered)}")
    assert again["feasible"] is True, again["binding"]


def test_the_size_a_refusal_offers_is_the_largest_that_fits(tmp_path: Path) -> None:
    """Qwen3-32B TP 4, --hicache-size 40 on 240 GiB: refused with '26 per rank would fit'. Yet
    --hicache-size 32 plans feasible, 33 is refused, and the auto mode cuts to 32 itself ((free - 10 GiB)
    / 7, planning.md). Offering 26 throws away 6 GB per rank (24 GB of host tier)."""
    refused = plan_json(tmp_path, qwen(**{"hicache-size": 40}))
    assert refused["feasible"] is False
    assert plan_json(tmp_path, qwen(**{"hicache-size": 32}))["feasible"] is True  # holds today
    assert plan_json(tmp_path, qwen(**{"hicache-size": 33}))["feasible"] is False  # holds today
    assert refused["host_budget"]["fitting_size_gb"] == 32


# -- the MemoryMax= a refusal offers -------------------------------------------------------------------


def _memory_max_offered_gib(reason: str) -> float | None:
    found = re.search(r"MemoryMax= of at least ([0-9.]+) GiB", reason)
    return float(found.group(1)) if found else None


def test_a_refusal_bound_by_host_ram_offers_no_memory_max_above_the_host(tmp_path: Path) -> None:
    """No cgroup limit anywhere, 256 GiB of RAM, --hicache-size 1000: the refusal says 'or a MemoryMax=
    of at least 6547.3 GiB holds this one'. A MemoryMax= never adds RAM; what binds is MemAvailable, so a
    limit larger than MemTotal is no way out (with 40: 'at least 288.8 GiB', still above the host)."""
    for size in (1000, 40):
        reason = plan_json(tmp_path, qwen(**{"hicache-size": size}))["binding"]
        offered = _memory_max_offered_gib(reason)
        assert offered is None or offered <= 256, reason


def test_a_refusal_bound_by_the_slice_names_the_slice(tmp_path: Path) -> None:
    """system.slice has memory.max = 128 GiB; --hicache-size 20 at TP 4 is refused (right), but the
    refusal offers 'a MemoryMax= of at least 158.4 GiB': the unit's limit cannot raise its slice's, and
    planning.md says a refusal bound there 'says "the slice's"'."""
    cgroup = [
        {"path": "system.slice/sglang.service", "max": None, "high": None, "current": 0, "file": 0},
        {"path": "system.slice", "max": 128 * GIB, "high": None, "current": 4 * GIB, "file": 2 * GIB},
    ]
    data = qwen(**{"hicache-size": 20})
    data["host_memory"] = host_memory(cgroup)
    reason = plan_json(tmp_path, data)["binding"]
    assert "Not enough host memory available" in reason  # holds today
    assert "slice" in reason, reason
    offered = _memory_max_offered_gib(reason)
    assert offered is None or offered <= 128, reason


# -- what the plan says about the pools it keeps -------------------------------------------------------


def test_a_host_pool_smaller_than_the_device_pool_is_a_warning(tmp_path: Path) -> None:
    """--hicache-size 32 gives 488,282 host tokens per rank beside 793,120 device tokens. SGLang 0.5.23
    logs 'HiCache ... host pool (N tokens) is smaller than the device pool ...; L2 cache effectiveness is
    reduced' (pool_host/base.py:237-245); the plan's text only says '40.0x the 32,000-token context'."""
    plan = plan_json(tmp_path, qwen(**{"hicache-size": 32}))
    assert plan["feasible"] is True
    assert plan["host_pool"]["tokens"] < plan["predicted_pool_tokens"]  # holds today
    said = " ".join(plan["warnings"] + plan["notes"])
    assert "smaller than the device pool" in said, said


def test_a_ratio_the_size_overrides_is_named_when_it_is_dropped(tmp_path: Path) -> None:
    """`--set hicache-ratio=0.5` over a unit with --hicache-size 32: SGLang lets the size win
    (fields/memory.py: 'Overrides --hicache-ratio'), and the plan removes the ratio (flags:
    hicache-ratio false). The flag the user just typed vanishes; the plan should say why."""
    plan = plan_json(tmp_path, qwen(**{"hicache-size": 32}), "--set", "hicache-ratio=0.5")
    assert plan["flags"].get("hicache-ratio") is False  # holds today: removed
    said = " ".join(plan["warnings"] + plan["notes"])
    assert "hicache-ratio" in said, said


# -- odd input -----------------------------------------------------------------------------------------


def test_a_zero_ratio_is_refused_naming_that_flag_alone(tmp_path: Path) -> None:
    """Only the ratio was given (0); the error names both flags, and says the size must be positive
    although --hicache-size 0 is SGLang's default and is accepted (it means: use the ratio)."""
    code, _, stderr = run(tmp_path, qwen(), "--set", "hicache-ratio=0")
    assert code == 2  # holds today
    assert "hicache-ratio" in stderr and "hicache-size" not in stderr, stderr
    assert run(tmp_path, qwen(), "--set", "hicache-size=0")[0] == 0  # holds today


# -- docs ----------------------------------------------------------------------------------------------


def test_the_docs_show_a_facts_files_host_memory_keys() -> None:
    """planning.md says a `--facts` file with host_memory 'is read and checked, a bad one refused', but
    no page names its keys (total, available, cgroup with path/max/high/current/file, siblings) or their
    unit (bytes); examples/ has no facts file with one. A newcomer learns them from tests/pure."""
    docs = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    examples = "\n".join(p.read_text() for p in sorted((ROOT / "examples").glob("*.json")))
    shown = docs + examples
    for key in ('"available"', '"cgroup"', '"siblings"', '"current"'):
        assert key in shown, key


def test_the_documented_host_memory_keys_are_the_facts_files_own(tmp_path: Path) -> None:
    """planning.md's host_memory table names exactly the keys a facts file's check reads (and the facts verb
    writes), and the example file carries every one of them and plans."""
    from agent.plan.facts import CgroupLevelFact, HostMemoryFact
    from agent.protocol.answers import CgroupLevelData, HostMemoryData

    rows = re.findall(
        r"^\| `host_memory\.([a-z_]+)(?:\[\]\.([a-z_]+))?` \|", (ROOT / "docs/planning.md").read_text(), re.M
    )
    top = {key for key, sub in rows if not sub}
    level = {sub for key, sub in rows if sub and key == "cgroup"}
    assert top == set(HostMemoryFact.model_fields) == set(HostMemoryData.__annotations__)
    assert level == set(CgroupLevelFact.model_fields) == set(CgroupLevelData.__annotations__)
    example = json.loads((ROOT / "examples/qwen3-32b-tp4-hicache.json").read_text())
    assert set(example["host_memory"]) == top
    assert (
        all(set(lv) == level for lv in example["host_memory"]["cgroup"]) and example["host_memory"]["cgroup"]
    )
    code, stdout, _ = run(tmp_path, example)
    assert code == 0 and "host memory:" in stdout and "(fits)" in stdout, stdout


# -- inventories, offline ------------------------------------------------------------------------------

QWEN_TOML = """
[ssh]
target = "gpu7"
[gpus]
memory_gib = 79.6
name = "NVIDIA H100 80GB HBM3"
indices = [0, 1, 2, 3]
[model]
path = "/models/Qwen3-32B"
attention = "gqa"
layers = 64
kv_heads = 8
head_dim = 128
weights_gib_per_gpu = 15.3
max_context = 131072
[unit]
name = "sglang-qwen.service"
{unit_extra}
[sglang]
port = 30000
[sglang.flags]
tp-size = 4
enable-hierarchical-cache = true
{hicache}
"""

DSV2_TOML = """
[ssh]
target = "gpu7"
[gpus]
memory_gib = 79.6
name = "NVIDIA H100 80GB HBM3"
indices = [4, 5, 6, 7]
[model]
path = "/models/DeepSeek-V2-Lite-Chat"
attention = "mla"
layers = 27
kv_lora_rank = 512
qk_rope_head_dim = 64
weights_gib_per_gpu = 8.0
max_context = 163840
[unit]
name = "sglang-dsv2.service"
[sglang]
port = 30001
[sglang.flags]
tp-size = 4
trust-remote-code = true
enable-hierarchical-cache = true
hicache-size = 20
"""


def write_units(tmp_path: Path, **files: str) -> Path:
    units = tmp_path / "units"
    units.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (units / f"{name}.toml").write_text(text)
    return units


def qwen_toml(hicache: str = "hicache-size = 40", unit_extra: str = "") -> str:
    return QWEN_TOML.format(hicache=hicache, unit_extra=unit_extra)


def cli(units: Path, *argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(units), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def offline_json(units: Path, name: str, *argv: str) -> dict[str, Any]:
    code, stdout, stderr = cli(units, "plan", name, "--offline", "--context", "64k", "--json", *argv)
    assert code in (0, 8), stderr
    return json.loads(stdout)  # type: ignore[no-any-return]


def test_a_ratio_the_plan_turns_into_a_size_is_named(tmp_path: Path) -> None:
    """[sglang.flags] hicache-ratio = 2 at TP 4, no host facts: the plan renders --hicache-size 103
    (412 GB of host pools on a host it never read) and drops the ratio; the text reads '--hicache-size 103
    GB x 4 rank(s)' as if the unit had it. Only `host_pool.as_given` in JSON says 'ratio'."""
    units = write_units(tmp_path, qwen=qwen_toml("hicache-ratio = 2"))
    plan = offline_json(units, "qwen")
    assert plan["host_pool"]["as_given"]["mode"] == "ratio"  # holds today
    assert plan["flags"]["hicache-size"] == 103 and plan["flags"]["hicache-ratio"] is False  # holds today
    said = " ".join(plan["warnings"] + plan["notes"])
    assert "hicache-ratio" in said, said


def test_an_offline_plan_counts_or_names_a_neighbours_explicit_pools(tmp_path: Path) -> None:
    """Two services on one host ([ssh] target gpu7), each TP 4: qwen --hicache-size 40, dsv2 --hicache-size
    20. planning.md: 'The budget counts the inventory's other services of the same host ... with their
    explicit --hicache-size pools'. Offline, qwen's host_budget.pinned is the same with or without dsv2,
    and nothing names dsv2: 'pinned 175 GiB' reads as all the host must hold (with dsv2: about 268 GiB)."""
    alone = offline_json(write_units(tmp_path / "a", qwen=qwen_toml()), "qwen")
    both = offline_json(write_units(tmp_path / "b", qwen=qwen_toml(), dsv2=DSV2_TOML), "qwen")
    said = " ".join(both["warnings"] + both["notes"])
    assert both["host_budget"]["pinned"] >= alone["host_budget"]["pinned"] + 4 * 20 * 10**9
    assert "dsv2" in said, said


ADOPTED = 'template = "sglang-adopted.service.j2"\nverbatim = {{ Service = ["MemoryMax={limit}"] }}'


def test_a_memory_max_systemd_ignores_is_not_called_checked(tmp_path: Path) -> None:
    """An adopted unit with MemoryMax=0 (systemd: 'Memory limit '0' out of range, ignoring.'; render
    refuses the unit through systemd-analyze verify). The plan says 'the pool checked under the unit's own
    MemoryMax=0.0G as SGLang checks it' and calls 160 GB of pools feasible under a zero limit."""
    units = write_units(tmp_path, qwen=qwen_toml(unit_extra=ADOPTED.format(limit="0")))
    code, stdout, _ = cli(units, "plan", "qwen", "--offline", "--context", "64k")
    assert "MemoryMax=0.0G as SGLang checks it" not in stdout, stdout
    assert code != 0 or "MemoryMax=0" in stdout, stdout


def test_a_memory_max_systemd_rejects_is_named_by_plan(tmp_path: Path) -> None:
    """planning.md: '64g is rejected by systemd and not read'. render refuses the unit ('Invalid memory
    limit '64g''); plan says only 'host memory: not read (no facts)', feasible, exit 0."""
    units = write_units(tmp_path, qwen=qwen_toml(unit_extra=ADOPTED.format(limit="64g")))
    _, stdout, stderr = cli(units, "plan", "qwen", "--offline", "--context", "64k")
    assert "64g" in stdout + stderr, stdout


def test_plan_and_render_agree_on_a_verbatim_memory_max(tmp_path: Path) -> None:
    """[unit] verbatim without the adopted template: render exits 2 ('only
    templates/sglang-adopted.service.j2 renders it'), but plan reads its MemoryMax=64G and refuses the
    pool under it, as if that limit would be in the unit."""
    extra = 'verbatim = { Service = ["MemoryMax=64G"] }'
    units = write_units(tmp_path, qwen=qwen_toml(unit_extra=extra))
    assert cli(units, "render", "qwen", "--context", "64k")[0] == 2  # holds today
    code, _, stderr = cli(units, "plan", "qwen", "--offline", "--context", "64k")
    assert code == 2, stderr


def test_a_pd_plans_text_names_the_decodes_retraction_pool() -> None:
    """units/pd-1p1d.toml: the decode's JSON plan carries host_pool (backup 'decode-retraction', 87,326
    tokens, 11.4 GB), but `plan pd-1p1d` prints one line per role, with no word of host memory."""
    code, stdout, _ = cli(ROOT / "units", "plan", "pd-1p1d", "--offline", "--context", "32k")
    assert code == 0  # holds today
    code, js, _ = cli(ROOT / "units", "plan", "pd-1p1d", "--offline", "--context", "32k", "--json")
    decode = json.loads(js)["roles"][1]["plan"]["host_pool"]
    assert decode["backup"] == "decode-retraction"  # holds today
    assert "retraction" in stdout or "host pool" in stdout, stdout


def test_a_decodes_explicit_ratio_is_not_called_auto(tmp_path: Path) -> None:
    """A PD decode with --hicache-ratio 0.5 and no HiCache: its retraction pool is 0.5 x the device pool,
    and an explicit ratio turns SGLang's auto sizing off (arg_groups/hicache_hook.py:123-124); JSON says
    as_given.mode 'ratio', the text says '(SGLang's auto size, at most x 4 rank(s), ...)'."""
    data = qwen()
    data["flags"] = {"tp-size": 4, "disaggregation-mode": "decode", "max-running-requests": 64,
                     "hicache-ratio": 0.5}  # fmt: skip
    code, stdout, _ = run(tmp_path, data)
    assert code == 0 and "decode retraction backup" in stdout  # holds today
    assert plan_json(tmp_path, data)["host_pool"]["as_given"]["mode"] == "ratio"  # holds today
    line = next(x for x in stdout.splitlines() if "decode retraction backup" in x)
    assert "auto size" not in line, line


def test_a_facts_file_with_more_available_than_total_is_refused(tmp_path: Path) -> None:
    """host_memory.available 300 GiB on a total of 256 GiB cannot come from /proc/meminfo: a hand-edited
    or mixed-up facts file. The facts are checked key by key (a negative or a float is refused in one
    line), but this one plans 'fits' against 256 GiB with exit 0."""
    data = qwen(**{"hicache-size": 32})
    data["host_memory"]["available"] = 300 * GIB
    code, _, stderr = run(tmp_path, data)
    assert code == 2 and "host_memory" in stderr, stderr
