"""Each role's pool, with the planner's own rule, for what that role holds.

A decode holds every running request's KV at the target context plus the tokens it reserves for each one's
next steps: --max-running-requests x (context + --num-reserved-decode-tokens) (SGLang 0.5.23
srt/disaggregation/decode.py: _active_reserved_tokens, 512 by default). A prefill holds the chunk it
computes and the prompts whose KV waits for a decode to pull it: chunk + [pd] prefill_in_flight x context,
the chunk SGLang's default for the card where --chunked-prefill-size is unset, a whole prompt where it is off.
The fraction, the reserve and the prediction are the planner's (plan/from_facts.py plan_for_host), one
plan per unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.inventory import HostConfig
from agent.pd.refusals import DEFAULT_RESERVED, DecodeNeed, tp_size
from agent.pd.units import PdUnit, Role, kv_checksum_skipped, pd_units, spec
from agent.plan.choose import Plan, Target
from agent.plan.from_facts import plan_for_host, plan_from_facts
from agent.plan.from_inventory import plan_input_from_inventory
from agent.plan.hostpool import Mode
from agent.protocol.addresses import same_host
from agent.sglang.memory_defaults import class_defaults

# Published results cut both ways; plan says so each time (docs/pd.md cites them).
TRADE = (
    "PD trades first-token time for steady decoding: GPUStack measured inter-token p99 25x better with "
    "first-token time up, an agentic-trace study +72 % first-token time with no decode gain; it pays for "
    "long prompts and short answers on medium-large models"
)


@dataclass(frozen=True)
class RolePlan:
    unit: PdUnit
    plan: Plan
    need_tokens: int  # what the role must hold at once
    need: str  # the rule, with its figures

    @property
    def holds(self) -> bool:
        return self.plan.predicted_pool_low_tokens >= self.need_tokens

    @property
    def feasible(self) -> bool:
        """Its own plan feasible (the planner's verdict, as a plain service's) and its pool holds its need."""
        return self.plan.feasible and self.holds

    @property
    def verdict(self) -> str:
        """What the text plan says of the role: NOT FEASIBLE with the planner's reason, as a plain service's
        plan says it, SHORT of its need, or holds."""
        if not self.plan.feasible:
            why = self.plan.binding or next(iter(self.plan.refusals), None) or "see plan --json"
            return f"NOT FEASIBLE: {why}"
        return "holds" if self.holds else "SHORT of its need"

    def to_dict(self) -> dict[str, object]:
        u = self.unit
        return {
            "role": u.role.value,
            "index": u.index,
            "target": u.target,
            "unit_name": u.host.unit.name,
            "url": u.url,
            "bootstrap_port": u.bound_bootstrap,  # the port its unit binds: a switch-capable decode binds one
            "need_tokens": self.need_tokens,
            "need": self.need,
            "holds": self.holds,
            "feasible": self.feasible,
            "plan": self.plan.to_dict(),
        }


def _int_flag(unit: PdUnit, name: str) -> int | None:
    value = unit.host.sglang.flags.get(name)
    return int(value) if isinstance(value, (int, str)) and str(value).lstrip("-").isdigit() else None


def decode_running(unit: PdUnit) -> int | None:
    return _int_flag(unit, "max-running-requests")


def attn_dp(unit: PdUnit) -> int:
    """Its attention DP size: --attn-dp-size, or the deprecated --enable-dp-attention with --dp-size."""
    size = _int_flag(unit, "attn-dp-size")
    on = unit.host.sglang.flags.get("enable-dp-attention")
    if size is None and on not in (None, False) and str(on).lower() not in ("false", "0"):
        size = _int_flag(unit, "dp-size")
    return max(1, size or 1)


def running_per_rank(unit: PdUnit) -> int:
    """What one of its pools holds at once: under attention DP each rank has its own pool and takes
    --max-running-requests // its DP size (SGLang 0.5.23 model_executor/pool_configurator.py
    `num_reqs = max(1, max_running_requests // attn_dp_size)`)."""
    return max(1, (decode_running(unit) or 1) // attn_dp(unit))


def reserved_tokens(unit: PdUnit) -> int:
    """--num-reserved-decode-tokens, SGLang's 512 when unset (0 is a value, not unset)."""
    value = _int_flag(unit, "num-reserved-decode-tokens")
    return DEFAULT_RESERVED if value is None else value


def prefill_chunk(unit: PdUnit, context: int) -> int:
    """The chunk a prefill computes at once: --chunked-prefill-size, else SGLang's default for the card's
    class, as the planner resolves it (sglang/memory_defaults.py class_defaults; srt/arg_groups/
    memory_hook.py:131-139: 8192 on a 60-90 GiB card); off (0 or below) is the whole prompt."""
    given = _int_flag(unit, "chunked-prefill-size")
    chunk = class_defaults(unit.host.gpus.memory_gib * 1024, 1)[0] if given is None else given
    return chunk if chunk > 0 else context


def need_of(host: HostConfig, unit: PdUnit, context: int) -> tuple[int, str]:
    if unit.role is Role.DECODE:
        running, dp = running_per_rank(unit), attn_dp(unit)
        reserved = reserved_tokens(unit)
        cap = f"{decode_running(unit) or 1} / {dp} DP ranks = {running}" if dp > 1 else f"{running}"
        return running * (context + reserved), (
            f"--max-running-requests {cap} x ({context} context + {reserved} reserved)"
        )
    counted = min(prefill_chunk(unit, context), context)
    in_flight = spec(host).prefill_in_flight
    return counted + in_flight * context, (
        f"chunk {counted} + {in_flight} in-flight transfer{'s' if in_flight > 1 else ''} x {context} context"
    )


def is_cpu_unit(unit: PdUnit) -> bool:
    return str(unit.host.sglang.flags.get("device") or "").lower() == "cpu"


def plan_unit(unit: PdUnit, asked: Target, sharing: int) -> Plan:
    """The planner's plan of one unit from the inventory. A CPU unit's pool is sized from the free RAM its
    start sees (plan/cpu.py), which a [pd] plan, asking no host, does not know: it is planned cold from
    [gpus] memory_gib as the host's RAM, split evenly among the `sharing` CPU units of its host (each
    starts beside the others)."""
    if not is_cpu_unit(unit):
        return plan_for_host(unit.host, asked, None, unit.host.sglang.flags)
    inp = plan_input_from_inventory(unit.host, unit.host.sglang.flags)
    free_mib = unit.host.gpus.memory_gib * 1024 / sharing
    inp = replace(inp, gpus=tuple(replace(g, memory_free_mib=free_mib) for g in inp.gpus))
    plan = plan_from_facts(inp, asked)
    said = (
        f"offline: [gpus] memory_gib {unit.host.gpus.memory_gib:g} GiB taken as the host's free RAM, "
        f"{free_mib / 1024:.2f} GiB for each of its {sharing} units on it"
    )
    return replace(plan, notes=(said, *plan.notes))


def role_plans(host: HostConfig, context: int, fraction: float | None = None) -> list[RolePlan]:
    """One plan per unit, from the inventory (offline), prefills first."""
    units = pd_units(host)
    plans = []
    for unit in units:
        running = decode_running(unit) if unit.role is Role.DECODE else None
        sharing = sum(1 for u in units if same_host(u.target, unit.target) and is_cpu_unit(u))
        plan = plan_unit(unit, Target(context, fraction, running), sharing)
        tokens, rule = need_of(host, unit, context)
        plans.append(RolePlan(unit, plan, tokens, rule))
    return shared_auto_pools(plans)


def auto_hicache(plan: Plan) -> bool:
    """HiCache left to SGLang's auto size (no --hicache-size or ratio; not a decode's backup): a [pd] plan,
    which reads no host, keeps it (plan/hostplan.py plan_host)."""
    return plan.host is not None and not plan.host.backup and plan.host.given.mode is Mode.AUTO


def shared_auto_pools(plans: list[RolePlan]) -> list[RolePlan]:
    """Two or more roles of one host with HiCache's auto size are refused: each auto-sizes 0.8 of the same
    free memory, its own ranks only (hicache_auto_size.py:90-97), and the group starts a wave's roles at once
    (group/run.py waves): they pin more than the host has (sglang#38156). Explicit sizes are planned, each
    with its MemoryMax=."""
    out = []
    for p in plans:
        same = [
            q.unit.label for q in plans if same_host(q.unit.target, p.unit.target) and auto_hicache(q.plan)
        ]
        if len(same) < 2 or not auto_hicache(p.plan):
            out.append(p)
            continue
        why = (
            f"HiCache with SGLang's auto size on {', '.join(same)} of host {p.unit.target}: each sizes "
            "0.8 of the same free memory as they start (hicache_auto_size.py:90-97) and together they pin "
            "more than the host has (sglang#38156); give each its own --hicache-size in its [pd] flags, "
            "their pools and processes within the host's memory"
        )
        plan = replace(p.plan, feasible=False, binding=why, refusals=(*p.plan.refusals, why))
        out.append(replace(p, plan=plan))
    return out


def decode_needs(plans: Sequence[RolePlan], context: int) -> list[DecodeNeed]:
    return [
        DecodeNeed(
            p.unit.label,
            running_per_rank(p.unit),
            context,
            reserved_tokens(p.unit),
            p.plan.predicted_pool_low_tokens,
            attn_dp(p.unit),
        )
        for p in plans
        if p.unit.role is Role.DECODE
    ]


def layout_width(host: HostConfig, unit: PdUnit) -> tuple[int, int]:
    """What of a role's KV layout its TP and PP widths change: its KV heads per rank (MLA's one latent is
    every rank's whole) and its PP stages (a stage owns fewer layers' buffers)."""
    tp, heads = tp_size(unit), host.model.kv_heads
    per_rank = 0 if host.model.attention == "mla" else max(1, heads // tp) if heads else tp
    return per_rank, _int_flag(unit, "pp-size") or _int_flag(unit, "pipeline-parallel-size") or 1


def unverified_pairs(host: HostConfig) -> list[str]:
    """Prefill-decode pairs whose KV SGLang admits unverified though the checksum is on: it signs the layout
    with each rank's per-page item lengths (srt/disaggregation/utils.py:263-284: another TP width for GQA,
    a PP stage) and skips a prefill of another signature (srt/disaggregation/decode.py:2580-2597)."""
    units = pd_units(host)
    prefills = [u for u in units if u.role is Role.PREFILL]
    decodes = [u for u in units if u.role is Role.DECODE]
    return [
        f"{p.label} (TP{tp_size(p)}) and {d.label} (TP{tp_size(d)})"
        for p in prefills
        for d in decodes
        if layout_width(host, p) != layout_width(host, d)
    ]


def checksum_line(host: HostConfig) -> str:
    """Whether the routed checks run with SGLang's KV checksum, in one line: where it is on, the pairs whose
    layouts differ are named, since SGLang skips the checksum between them."""
    skipped = kv_checksum_skipped(host)
    if skipped is not None:
        return f"KV checksum: skipped ({skipped}); the routed check proves the transfer without it"
    pairs = unverified_pairs(host)
    if pairs:
        return (
            f"KV checksum: on in every role, but skipped between {'; '.join(pairs)}: SGLang signs the KV "
            "layout with its TP and PP width and admits those transfers unverified; the routed check proves "
            "the transfer without it"
        )
    return ("KV checksum: on in every role (--disaggregation-enable-kv-checksum): a routed check whose "
            "KV arrives corrupted fails the change")  # fmt: skip


def text(host: HostConfig, plans: Sequence[RolePlan]) -> str:
    """The per-role summary plan prints: each unit's pool against its need, and the trade."""
    lines = [f"{host.name}: prefill-decode service, {spec(host).transfer_backend} transfer"]
    for p in plans:
        u, plan = p.unit, p.plan
        gpus = ",".join(map(str, u.host.gpus.indices or ()))
        lines.append(
            f"  {u.label:<11} {u.target}:{u.host.sglang.port} GPUs {gpus}"
            f"  --mem-fraction-static {plan.mem_fraction_static:.3f}: pool ~{plan.predicted_pool_low_tokens} "
            f"tokens, needs {p.need_tokens} ({p.need}): {p.verdict}"
        )
        if (
            plan.host is not None
        ):  # its host pool (HiCache, or a decode's retraction backup): host RAM it pins
            lines.append(f"    {plan.host.lines(plan.predicted_pool_tokens, plan.context_length)[0]}")
    lines.append(checksum_line(host))
    lines.append(f"note: {TRADE}")
    return "\n".join(lines)
