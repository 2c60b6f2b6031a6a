"""Which earlier starts are evidence for a plan, and the flags they ran under.

A start calibrates only a plan of its own architecture (`type=`), parallel layout and cards
(plan/startcheck.py). A facts file's `last_start` that is not is set aside with a headline warning
(`--from-log` is refused in one line by the CLI, with the same check). A start under other cell-changing
flags (KV dtype, page size, a draft added or removed) is still evidence for its memory: the plan
calibrates at the start's flags and scales the measured cell by the architecture's ratio
(plan/predict.py _calibrated_as_started), and the verdict line says from which. A `--from-log` start's KV
dtype is what its server_args line says (plan/startcheck.py identity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from agent.inventory import FlagValue
from agent.plan.facts import PlanInput
from agent.plan.inputs import draft_model
from agent.plan.model import PoolModel
from agent.plan.startcheck import Planned, refusal, short_card

# A start whose measured bytes per token differ from the architecture's by more than this is not a start of
# this model under these flags (2-decimal logs and SGLang's reservations stay within a few per cent; a wrong
# KV dtype or another model is 50 % off or more): it is set aside, not fitted.
CELL_EVIDENCE = 0.10


class NotEvidence(Exception):
    """A start that does not calibrate this plan, and why (one line)."""


# The flags that shape the cell: a start under other values measured another cell.
CELL_FLAGS = (
    "kv-cache-dtype",
    "page-size",
    "speculative-algorithm",
    "speculative-draft-model-path",
    "speculative-draft-kv-cache-dtype",
    "speculative-num-draft-tokens",
    "swa-full-tokens-ratio",
    "disable-hybrid-swa-memory",
)


def admitted(inp: PlanInput, tp: int, pp: int) -> tuple[PlanInput, tuple[str, ...]]:
    """The input with the logged starts that are not of this model, layout or cards set aside, and why."""
    if not inp.start_ids:
        return inp, ()
    archs = inp.model.config.value("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    planned = Planned(arch, inp.model.path or "", tp, pp, "auto", inp.gpu.memory_gib)
    kept, ids, warnings = [], [], []
    for figures, start in zip(inp.starts, inp.start_ids, strict=False):
        why = refusal(start, planned)
        if why is None:
            kept.append(figures)
            ids.append(start)
            warnings += [short] if (short := short_card(start, planned)) else []
        else:
            warnings.append(f"the earlier start is set aside: {why}; it does not calibrate this plan")
    rest = inp.starts[len(inp.start_ids) :]  # starts without what their log ran (the inventory's history)
    if not warnings:
        return inp, ()
    # one line per reason: a facts file's last start and the same start's log say it twice
    return replace(inp, starts=(*kept, *rest), start_ids=tuple(ids)), tuple(dict.fromkeys(warnings))


def as_started(inp: PlanInput) -> PlanInput | None:
    """The input under the flags its starts ran with, when a cell-changing flag differs since; else None."""
    kv = next((s.kv_dtype for s in inp.start_ids if s.kv_dtype), None)
    logged = next((dict(s.cell_flags) for s in inp.start_ids if s.cell_flags), {})
    if inp.start_flags is None and kv is None and not logged:
        return None
    # A --from-log start says what its server_args line says (the KV dtype, the page size, the speculative
    # algorithm); the plan's other flags stand for its.
    then: dict[str, FlagValue] = dict(inp.start_flags if inp.start_flags is not None else inp.flags)
    if kv is not None:
        then["kv-cache-dtype"] = kv
    for name, value in logged.items():
        if value is None:
            then.pop(name, None)
        else:
            then[name] = value
    if all(_same(then, inp.flags, name) for name in CELL_FLAGS):
        return None
    merged = {k: v for k, v in inp.flags.items() if k not in CELL_FLAGS}
    merged.update({k: v for k, v in then.items() if k in CELL_FLAGS})
    return replace(inp, flags=merged)


def ran_runtime(inp: PlanInput) -> dict[str, FlagValue]:
    """The flags the starts ran under as far as the runtime's need after the pool goes (CUDA graphs, DeepEP):
    what their server_args line says (plan/startcheck.py), else the start's flags, else the plan's."""
    then: dict[str, FlagValue] = dict(inp.start_flags if inp.start_flags is not None else inp.flags)
    logged = next((dict(s.runtime_flags) for s in inp.start_ids if s.runtime_flags), {})
    for name, value in logged.items():
        if value is None:
            then.pop(name, None)
        else:
            then[name] = value
    return then


def changed_since(then: Mapping[str, FlagValue], now: Mapping[str, FlagValue]) -> tuple[str, ...]:
    """The cell-changing flags a start ran with that the plan changes, as the start had them."""
    return tuple(f"--{n} {_value(then, n) or 'unset'}" for n in changed_names(then, now))


def changed_names(then: Mapping[str, FlagValue], now: Mapping[str, FlagValue]) -> tuple[str, ...]:
    """The cell-changing flags whose value differs, an unset KV dtype being auto (as SGLang's default)."""
    return tuple(n for n in CELL_FLAGS if not _same(then, now, n))


def _same(a: Mapping[str, FlagValue], b: Mapping[str, FlagValue], name: str) -> bool:
    return _value(a, name) == _value(b, name)


def _value(flags: Mapping[str, FlagValue], name: str) -> str | None:
    value = flags.get(name)
    if name == "kv-cache-dtype" and value in (None, "auto"):
        return "auto"
    if name == "page-size" and value is not None and str(value) == "1":  # a start's log states the default
        return None
    return None if value is None else str(value)


def partial(inp: PlanInput, post: float, tp: int) -> tuple[float, str] | None:
    """A start cut before the draft the service declares had loaded: the memory after the weights it shows
    is after the target's alone, so the draft's weights per GPU come off it (0.5.14+ loads the draft
    before sizing the pool, Scheduler.init_model_worker). None when the start is whole or says nothing."""
    algorithm = draft_model(inp.flags)
    if not inp.start_ids or inp.draft is None or algorithm is None or inp.start_ids[-1].loads != 1:
        return None
    draft = (inp.draft.weights_bytes or 0) / max(1, tp) / 2**30
    why = (
        f"partial start: cut after the target's weights, before the {algorithm} draft loaded; its memory "
        f"after the weights less the draft's {draft:.2f} GiB per GPU"
        + ("" if draft else " (unknown: the facts lack draft.weights_bytes)")
    )
    return post - draft, why


def decode_note(inp: PlanInput) -> str:
    """The third trade-off, decode speed: what the last load check measured, else how to measure it."""
    if inp.decode is None:
        return (
            "decode speed: not measured: set [smoke] load = N in the inventory, and the next apply's load "
            "check measures decode ms/token at its long prompt's context (agent/host/watch/loadcheck.py)"
        )
    ms, at = inp.decode
    where = f"at {at:,} tokens" if at else "at the load check's long prompt"
    return f"decode speed: {ms:,.1f} ms/token {where}, measured by the last load check ([smoke] load)"


def draft_gone(
    inp: PlanInput, algorithm: str | None, shape: PoolModel, notes: list[str], said: str
) -> PoolModel | None:
    """A start that ran a draft the plan drops (algorithm) and no longer describes (an inventory without its
    [draft] table): the start's cell cannot be sized, but its memory still calibrates, as a start that logged
    no pool does: pre, and the memory after the target's weights, before the draft loaded (the draft's
    weights come back; 0.5.14+ loads it before sizing the pool, Scheduler.init_model_worker), with the
    architecture's cell; said tells the gate the start is no proof of these flags' pool (apply.py). None where
    the plan keeps a draft or the start's memory lines are missing."""
    keys = ("avail_mem_before_weights_gb", "avail_mem_after_weights_gb")
    memory = [f for f in inp.starts if all(f.get(k) for k in keys)]
    if algorithm is None or inp.draft is not None or not memory:
        return None
    pre, post = (float(str(memory[-1].get(k) or 0.0)) for k in keys)
    notes.append(
        f"the start ran with a {algorithm} draft the plan drops and does not describe: its cell cannot be "
        f"sized here, so pre {pre:.2f} GiB and post {post:.2f} GiB (after the target's weights, before the "
        "draft's) calibrate the memory, the cell is the architecture's"
    )
    return replace(shape, pre_gib=pre, post_gib=post, basis="calibrated", said=(*shape.said, said))
