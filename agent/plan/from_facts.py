"""The one planner: a PlanInput (a facts file, the host's facts, or the inventory) to a Plan, in the steps
of plan/: the architecture (sizing.py), the evidence (evidence.py), the prediction (predict.py), the choice
and its verdict (choose.py, verdict.py), the alternatives re-planned (alternatives.py, replan.py).

Follows SGLang 0.5.23 (files named per rule, relative to sglang/srt/). Every figure's origin goes into the
notes; a kind deployctl does not follow is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from agent.inventory import HostConfig
from agent.plan.choose import Plan, Target, choose
from agent.plan.cpu import is_cpu, plan_cpu
from agent.plan.evidence import decode_note
from agent.plan.facts import PlanInput, parse_facts, service_gpus
from agent.plan.from_inventory import plan_input_from_host, plan_input_from_inventory
from agent.plan.hostbudget import ServiceNeed
from agent.plan.hostwire import with_host_plan
from agent.plan.inputs import origin, sglang_version
from agent.plan.model import Flags, PoolModel, StartFigures
from agent.plan.predict import FactsModel, pool_model
from agent.plan.replan import replanned
from agent.plan.sizing import parallel, sizing
from agent.plan.startcheck import StartIdentity
from agent.plan.synthetic import synthetic_host
from agent.protocol.answers import HostFacts, HostMemoryData
from agent.sglang.pools import PoolSizer

Calibration = StartFigures | Sequence[StartFigures]


def plan_from_facts(inp: PlanInput, asked: Target, replan: bool = True) -> Plan:
    """Plan a host from its PlanInput: a facts file, the host's own facts, or the inventory. The notes
    name every figure's origin."""
    origins = "figures from " + "; ".join(f"{k}: {v}" for k, v in inp.sources.items())
    if is_cpu(inp):
        arch = sizing(inp)
        plan = replace(plan_cpu(inp, asked, arch.sizer, (*arch.notes, origins)), given=asked.given)
        return _host_planned(inp, arch.sizer, plan)
    fm = pool_model(_capped(inp, asked), asked.context)
    running = _running_pool(inp, asked)
    # The running fraction as the unit is given it: three decimals (a VLM's SGLang default is unrounded).
    # Left unset, it is SGLang's default for the flags the unit runs now, not for the ones a --set plans.
    fraction = running[1] if running is not None else fm.fraction
    host = synthetic_host(inp, fm.layout, round(fraction, 3), parallel(inp), fm.floor.gib)
    pool = running[0] if running is not None else None
    plan = choose(host, asked, fm.pool, inp.starts, _estimate_notes(fm.pool, inp), pool)
    extra = [*fm.notes, origins, *_attention_dp_note(inp, fm), *_state_notes(inp, fm, plan), decode_note(inp)]
    warnings = (*fm.warnings, *plan.warnings, *_version_warning(inp))
    plan = replace(plan, notes=(*extra, *plan.notes), warnings=warnings)
    plan = _host_planned(inp, fm.pool.sizer, plan)  # HiCache: the host pool and the host's memory budget
    # Each alternative as the planner plans it with its flags (plan/replan.py), not re-checked again.
    return replanned(inp, plan, asked, lambda i, t: plan_from_facts(i, t, replan=False)) if replan else plan


def _host_planned(inp: PlanInput, sizer: PoolSizer | None, plan: Plan) -> Plan:
    """with_host_plan, keeping the device plan's own refusal apart: the host's memory (its override) and
    the device (--force) are passed each by their own override."""
    device = None if plan.feasible else plan.binding or "the device plan cannot reach the target"
    return replace(with_host_plan(inp, sizer, plan), device_refusal=device)


def _capped(inp: PlanInput, asked: Target) -> PlanInput:
    """The input under an asked request cap (plan --max-running-requests N, or its --set): the unit runs
    with it, so the memory floor's decode graphs and prefill are derived with it as with the flag."""
    if not asked.max_running:
        return inp
    return replace(inp, flags={**inp.flags, "max-running-requests": asked.max_running})


def _running_pool(inp: PlanInput, asked: Target) -> tuple[PoolModel, float] | None:
    """The pool of the flags the unit runs now, and its fraction (the flag, else SGLang's default for
    those flags), where a --set changes them (its KV dtype, a draft, a max-total-tokens cap, a chunk that
    moves SGLang's default fraction): what a shrink is measured from. None when they are the planned ones."""
    ran = inp.start_flags
    if not asked.given or ran is None or dict(ran) == dict(inp.flags):
        return None
    try:
        model = pool_model(replace(inp, flags=dict(ran)), asked.context)
    except ValueError:  # the running flags do not size (the planned ones did): no shrink is claimed
        return None
    return model.pool, model.fraction


def _estimate_notes(model: PoolModel, inp: PlanInput) -> tuple[str, ...]:
    if model.basis != "architecture":
        return ()
    return (
        f"estimated from {origin(inp)}: pre {model.pre_gib:.2f} GiB, post {model.post_gib:.2f} GiB, "
        f"{model.cell_bytes_effective():,.0f} B/token; the first real start will calibrate the plan",
    )


def _version_warning(inp: PlanInput) -> tuple[str, ...]:
    version = sglang_version(inp)
    if version is not None and version[:3] == (0, 5, 23):
        return ()
    return (
        f"the host runs SGLang {inp.sglang_version}: this plan follows 0.5.23's sizing rules "
        "(the versions differ in drafts before 0.5.14, DFLASH before 0.5.18 and the hybrid pools); "
        "let the first start calibrate it",
    )


def _attention_dp_note(inp: PlanInput, fm: FactsModel) -> tuple[str, ...]:
    if parallel(inp).attn_dp > 1 and fm.pool.basis == "architecture":
        return ("attention DP replicates the attention weights on every rank: the cold post is optimistic",)
    return ()


def _state_notes(inp: PlanInput, fm: FactsModel, plan: Plan) -> list[str]:
    """What the hybrid pools hold besides the full-attention tokens: state slots, sliding-window tokens."""
    notes: list[str] = []
    sizer = fm.pool.sizer
    if sizer is not None and sizer.mamba is not None and plan.mem_fraction_static:
        rest = fm.pool.post_gib - fm.pool.pre_gib * (1 - plan.mem_fraction_static * fm.pool.fraction_scale)
        slots, per = sizer.mamba.slots(rest - sizer.reserve_gib), sizer.mamba.per_request
        notes.append(
            f"the state cache holds {slots:,} slots: SGLang caps --max-running-requests at {slots // per:,} "
            f"({per} slot(s) per request)"
        )
    if sizer is not None and sizer.swa_ratio is not None:
        swa = sizer.swa_tokens(plan.predicted_pool_tokens)
        window = fm.layout.sliding_window
        notes.append(f"the sliding-window layers hold {swa:,} tokens (window {window})")
        if window and swa is not None and swa <= window + fm.pool.page_size:
            notes.append("SGLang refuses this: 'SWA pool ... cannot hold even one request' (raise the ratio)")
    return notes


def plan_from_host_facts(
    host: HostConfig,
    facts: HostFacts,
    calibration: Sequence[StartFigures] | None,
    asked: Target,
    neighbours: tuple[ServiceNeed, ...] = (),
) -> Plan | None:
    """The plan from what the host's agent read (config.json, safetensors headers, nvidia-smi), the
    inventory's figures overriding; None when the host gave no config.json (plan_for_host plans then)."""
    given = facts.get("model_facts")
    if not isinstance(given, Mapping):
        return None
    doc: dict[str, object] = dict(given)  # the facts document, as parse_facts reads it
    if not (given.get("sglang") or {}).get("version"):
        doc["sglang"] = {"version": host.sglang.version}
    rows = given.get("gpus")
    inventory_gpus = not rows
    if not rows:  # no nvidia-smi on the host: the inventory's cards
        card = {"name": host.gpus.name, "memory_total_mib": host.gpus.memory_gib * 1024}
        doc["gpus"] = [card] * host.gpus.count
    else:  # the host's GPUs: only this service's own
        doc["gpus"] = service_gpus(rows, host)
    inp = plan_input_from_host(host, parse_facts(doc, name=f"{host.name} (host facts)"),
                               starts=tuple(calibration or ()))  # fmt: skip
    inp = replace(inp, host_memory=facts.get("host_memory"), neighbours=neighbours)  # HiCache's budget
    if inventory_gpus:
        inp = replace(inp, sources={**inp.sources, "gpus": "inventory: gpus (no nvidia-smi rows)"})
    return plan_from_facts(inp, asked)


def plan_for_host(  # noqa: PLR0913 - the service, the target, its starts, flags, ids, the others, host RAM
    host: HostConfig,
    asked: Target,
    calibration: Calibration | None,
    running_flags: Flags,
    ids: Sequence[StartIdentity] = (),
    neighbours: tuple[ServiceNeed, ...] = (),
    host_memory: HostMemoryData | None = None,
) -> Plan:
    """Plan from the inventory: the host becomes the PlanInput a facts file would (plan/from_inventory.py),
    the running unit's flags over the baseline and the earlier starts calibrating it (with what their logs
    say they ran, where read: `--from-log`), and is planned by the one planner (plan_from_facts).
    `host_memory`, `neighbours`: the host's memory as its facts read it and the inventory's other services
    of the host (HiCache's budget), checked even when the host gave no config.json."""
    history = (calibration,) if isinstance(calibration, Mapping) else tuple(calibration or ())
    inp = plan_input_from_inventory(host, running_flags, history)
    inp = replace(inp, host_memory=host_memory, neighbours=neighbours)
    # The inventory's config.json stands in with a family's architecture: the model path was checked
    # where the log was read (cli plan checked_starts), the rest of what the start ran is kept.
    ran = tuple(replace(i, architecture=None) for i in ids)[: len(history)]
    return plan_from_facts(replace(inp, start_ids=ran), asked)
