"""The prediction: the pool model of the host's model, cold from the facts (plan/overhead.py) or calibrated
by the earlier starts that are evidence for it (plan/evidence.py, plan/calibrate.py), on the architecture's
sizer (plan/sizing.py). What the verdict (plan/verdict.py) and the choice (plan/choose.py) then read.

Follows SGLang 0.5.23 (files named per rule, relative to sglang/srt/). Every figure's origin goes into the
notes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from agent.errors import UsageError
from agent.plan.calibrate import Fit, calibrated
from agent.plan.evidence import (
    NotEvidence,
    admitted,
    as_started,
    changed_names,
    changed_since,
    draft_gone,
    partial,
    ran_runtime,
)
from agent.plan.facts import PlanInput
from agent.plan.floor import FIXED_GIB, GRAPH_FIT, Floor, Part, Shapes, Sizes, derive, graph_gib, shapes
from agent.plan.inputs import (
    OFF,
    decode_graphs_off,
    draft_model,
    float_of,
    int_of,
    is_on,
    origin,
    sglang_version,
    value_of,
)
from agent.plan.model import SPEC_DEFAULT_REQUESTS, Flags, PoolModel, Start, StartFigures, start_of
from agent.plan.overhead import (
    RankLayout,
    is_amd,
    outside_service,
    overhead_for,
    release_quick_reduce,
    since_start,
)
from agent.plan.sizing import Sizing, attention_backend, parallel, sizing
from agent.sglang import memory_defaults, pools
from agent.sglang.config_json import with_override
from agent.sglang.kvlayout import KVLayout, Unsupported, read_layout, text_config
from agent.sglang.kvpool import GIB
from agent.sglang.pools import Parallel


@dataclass(frozen=True)
class FactsModel:
    pool: PoolModel
    layout: KVLayout
    kv_dtype: str
    fraction: float  # the running fraction: the flag, else SGLang's own default
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # earlier starts set aside (plan/evidence.py): said first
    floor: Floor = field(default_factory=lambda: Floor(FIXED_GIB))  # what stays free after the pool


def _mode(flags: Flags) -> str | None:
    """--disaggregation-mode: prefill or decode; null (the default) is None."""
    mode = str(value_of(flags, "disaggregation-mode") or "null").lower()
    return mode if mode in ("prefill", "decode") else None


def _fraction(inp: PlanInput, layout: KVLayout, par: Parallel, notes: list[str]) -> float:
    """The running fraction: the flag, else SGLang's own default (arg_groups/memory_hook.py)."""
    given = float_of(inp.flags, "mem-fraction-static")
    if given is not None:
        return given
    given_flags = memory_defaults.MemoryFlags(
        chunked_prefill=int_of(inp.flags, "chunked-prefill-size"),
        decode_max_bs=_decode_max_bs(inp),
        max_running_requests=int_of(inp.flags, "max-running-requests"),
        max_total_tokens=int_of(inp.flags, "max-total-tokens"),
        cuda_graph=not decode_graphs_off(inp.flags),
        max_prefill_tokens=int_of(inp.flags, "max-prefill-tokens"),
        disaggregation=_mode(inp.flags),
        draft_tokens=int_of(inp.flags, "speculative-num-draft-tokens"),
        text_served_vlm=_text_served_vlm(inp, layout),
        prefill_backend=_prefill_backend(inp.flags),
        graphs_to_running=_graphs_to_running(inp, layout),
        deepep=deepep(inp.flags),
        post_capture=post_capture_env(inp),
    )
    settings = memory_defaults.default_fraction(layout, inp.gpu.memory_total_mib, par, given_flags)
    notes.append(
        f"--mem-fraction-static is not set: SGLang 0.5.23 would use about {settings.fraction:.3f} on this "
        "card (arg_groups/memory_hook.py handle_gpu_memory_settings); the plan gives the unit its own, to "
        "three decimals"
    )
    return settings.fraction


def _prefill_backend(flags: Flags) -> str | None:
    """The prefill graph's backend the flags set (arg_groups/cuda_graph_hook.py:55-71 parse_cuda_graph_config:
    --cuda-graph-backend-prefill over --disable-prefill-cuda-graph); None: SGLang's default."""
    given = value_of(flags, "cuda-graph-backend-prefill")
    if given is not None:
        return str(given).lower()
    return "disabled" if is_on(flags, "disable-prefill-cuda-graph") else None


def _text_served_vlm(inp: PlanInput, layout: KVLayout) -> bool:
    """--language-only on a checkpoint SGLang's ModelConfig takes as multimodal (configs/model_config.py:
    820-828: an architecture off by default counts only with --enable-multimodal)."""
    f = inp.flags
    if layout.multimodal or not is_on(f, "language-only") or is_on(f, "language-model-only"):
        return False
    try:
        raw = read_layout(inp.model.config)
    except Unsupported:  # sizing() read it with the flags' override; refusals are its to state
        return False
    return raw.multimodal and (not raw.multimodal_off_by_default or is_on(f, "enable-multimodal"))


def _aiter_scale(inp: PlanInput, arch: Sizing, context: int, notes: list[str]) -> float:
    """arg_groups/attention_hook.py: aiter above 8k context runs at 0.85 x the fraction."""
    backend = attention_backend(inp, arch.layout, arch.par)
    explicit = value_of(inp.flags, "mem-fraction-static") is not None
    honor = bool(inp.env.get("SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION"))
    scale = memory_defaults.aiter_fraction(
        1.0, backend=backend, context_len=context, explicit=explicit, honor=honor
    )
    if scale != 1.0:
        notes.append(
            "AMD aiter with a context above 8,192: SGLang runs at 0.85 x the given --mem-fraction-static "
            "(arg_groups/attention_hook.py); set SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION=1 in the unit to "
            "use the fraction as given. The plan accounts for the 0.85"
        )
    elif backend is not None and is_amd(inp.gpu.name) and value_of(inp.flags, "attention-backend") is None:
        notes.append(
            f"AMD: SGLang picks the {backend} attention backend for this model, so no 0.85 x fraction"
        )
    return scale


def _runner_vlm_scale(inp: PlanInput, notes: list[str]) -> float:
    """Builds before 0.4.9 ran a multimodal model at a share of the given fraction (memory_defaults.py
    runner_vlm_factor); its checkpoint's architecture decides, as their ModelConfig.is_multimodal did."""
    factor = memory_defaults.runner_vlm_factor(sglang_version(inp))
    try:
        if factor == 1.0 or not read_layout(inp.model.config).multimodal:
            return 1.0
    except Unsupported:  # sizing() read it with the flags' override; refusals are its to state
        return 1.0
    notes.append(
        f"SGLang {inp.sglang_version} runs a multimodal model at {factor:.2f} x the given "
        "--mem-fraction-static (model_executor/model_runner.py of builds before 0.4.9): the plan sizes the "
        "pool at the scaled fraction, because it is multimodal"
    )
    return factor


# How a plan says its start ran under other cell-changing flags (Plan.evidence): the start is then evidence
# for the memory, not proof that these flags gave this pool (apply.calibrated_pool).
SCALED_FROM = "the cell scaled from a start at"


def pool_model(inp: PlanInput, context: int) -> FactsModel:
    """The PoolModel for this host: cold from the facts, or calibrated by the last start's memory lines."""
    arch = sizing(inp)
    layout, dtype, par, sizer, notes = arch.layout, arch.dtype, arch.par, arch.sizer, list(arch.notes)
    inp, aside = admitted(inp, par.tp, par.pp)  # only a start of this model, layout and cards calibrates
    fraction = _fraction(inp, layout, par, notes)
    scale = _aiter_scale(inp, arch, context, notes) * _runner_vlm_scale(inp, notes)
    # What every model of this host shares; the memory figures and the cell come from the starts or the card.
    shape = PoolModel(
        0.0, 0.0, sizer.cell_bytes, "architecture", 0.0, False, page_size=sizer.page_size,
        max_total_tokens=sizer.max_total_tokens, dp=par.attn_dp, sizer=sizer, fraction_scale=scale,
        heads=_heads(inp), refused=arch.refused,
    )  # fmt: skip
    model, aside = _evidenced(inp, fraction, par, (shape, sizer), (notes, aside))
    model = _runtime_since(inp, model, _graphs_estimate(inp, layout, par, context), notes)
    if post_capture_env(inp) and not layout.kv_lora_rank:
        notes.append(
            "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is set: SGLang may resize the pool after graph capture "
            "(model_runner_components/kv_pool_runtime.py), taking the graphs' memory from the pool: the pool "
            "predicted here is sized before capture and may be larger than SGLang's by that much"
        )
    # a draft added since the start brings graphs its measured figures do not hold
    then = as_started(inp) if inp.starts else None
    measured = model.runtime_measured and added_draft(inp, then) is None and removed_draft(inp, then) is None
    floor = floor_of(inp, layout, par, context, measured=measured)
    return FactsModel(model, layout, dtype, fraction, (*notes, floor.said()), aside, floor)


def deepep(flags: Flags) -> bool:
    """--moe-a2a-backend deepep, in any --deepep-mode: normal turns the graphs off (arg_groups/moe_hook.py:
    383-397) after the default fraction has reserved for them (0.775 for Qwen3-30B-A3B at TP 8 on H100,
    as with auto), and its buffers are allocated all the same."""
    return str(value_of(flags, "moe-a2a-backend") or "none").lower() == "deepep"


def post_capture_env(inp: PlanInput) -> bool:
    """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING in the unit's environment, without a flag that rules it out
    (arg_groups/overrides.py:1791-1815: KV-cache sharding, the memory saver, decode context parallel)."""
    if str(inp.env.get("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "")).lower() not in ("1", "true", "yes"):
        return False
    ruled_out = any(is_on(inp.flags, n) for n in ("enable-kv-cache-sharding", "enable-memory-saver"))
    return not ruled_out and (int_of(inp.flags, "dcp-size") or 1) == 1


def deepep_gib(flags: Flags) -> float:
    """DeepEP's all-to-all buffers per GPU (memory_defaults.deepep_a2a_mib): allocated after the pool, while
    the decode graphs are captured."""
    memory_flags = memory_defaults.MemoryFlags(
        cuda_graph=not decode_graphs_off(flags), disaggregation=_mode(flags), deepep=deepep(flags)
    )
    return memory_defaults.deepep_a2a_mib(memory_flags) / 1024


def _runtime_since(inp: PlanInput, model: PoolModel, graphs: Part | None, notes: list[str]) -> PoolModel:
    """What the runtime takes after the pool that the calibrating start did not measure: decode CUDA graphs
    it ran without (the cold floor's estimate, added to its measured need) and DeepEP's buffers; plus
    --enable-symm-mem's pre-allocation. A start that ran them measured them in its free memory."""
    then = ran_runtime(inp) if model.runtime_measured else {}
    graphs_then = model.runtime_measured and not decode_graphs_off(then)
    extra = deepep_gib(inp.flags) - (deepep_gib(then) if graphs_then else 0.0)
    if extra > 0:
        notes.append(
            f"DeepEP's all-to-all buffers take {extra:.2f} GiB per GPU after the pool "
            "(arg_groups/memory_hook.py:402-414 reserve_for_deepep_a2a_mb)"
            + (": the earlier start ran without them" if then else "")
        )
    model = replace(model, prealloc_gib=symm_prealloc_gib(inp) + max(0.0, extra))
    if not model.runtime_measured or graphs_then or decode_graphs_off(inp.flags):
        return model
    if graphs is None:  # no shapes to estimate them by: the start's need does not stand for the plan's
        notes.append("the earlier start ran without CUDA graphs: its runtime need is not used")
        return replace(model, runtime_gib=0.0, runtime_measured=False, graph_gib=0.0)
    notes.append(
        f"the earlier start ran without CUDA graphs (--disable-cuda-graph): their {graphs.gib:.2f} GiB per "
        f"GPU ({graphs.source}) are added to the need it measured"
    )
    return replace(model, runtime_gib=model.runtime_gib + graphs.gib)


def symm_prealloc_gib(inp: PlanInput) -> float:
    """--enable-symm-mem pre-allocates SGLANG_SYMM_MEM_PREALLOC_GB_SIZE GiB per GPU (4 when unset,
    arg_groups/memory_hook.py:349-354) after the pool and the graphs (cuda_graph_setup.py:461,
    pynccl_allocator.py:510-536): out of the slack the floor keeps free."""
    if not is_on(inp.flags, "enable-symm-mem"):
        return 0.0
    try:
        return float(inp.env.get("SGLANG_SYMM_MEM_PREALLOC_GB_SIZE", 4))
    except ValueError:
        return 4.0


def _heads(inp: PlanInput) -> tuple[int, int]:
    """The text config's attention and KV heads (0: not stated): what SGLang's attention layers divide."""
    try:
        text = text_config(with_override(inp.model.config, value_of(inp.flags, "json-model-override-args")))
    except (ValueError, Unsupported):
        return (0, 0)
    heads = int(text.number("num_attention_heads") or 0)
    kv = int(text.number("num_key_value_heads") or heads)
    # the inventory states KV heads only; its stand-in config repeats them as attention heads
    return (0, kv) if origin(inp) == "the inventory" else (heads, kv)


def floor_of(inp: PlanInput, layout: KVLayout, par: Parallel, context: int, measured: bool) -> Floor:
    """The memory floor: the person's, else derived from the model's shapes and what SGLang captures and
    prefills under these flags (their defaults by card class: arg_groups/memory_hook.py)."""
    if inp.planning.reserve_floor_gib is not None:
        return Floor(inp.planning.reserve_floor_gib, stated=True)
    return derive(_shapes(inp, layout, par), _floor_sizes(inp, layout, par, context, measured))


def _shapes(inp: PlanInput, layout: KVLayout, par: Parallel) -> Shapes | None:
    try:
        text = text_config(with_override(inp.model.config, value_of(inp.flags, "json-model-override-args")))
        return shapes(text, par.tp, layout.dtype_bytes, par.pp)
    except (ValueError, Unsupported):  # sizing() read the same config and said what it made of it
        return None


def _floor_sizes(inp: PlanInput, layout: KVLayout, par: Parallel, context: int, measured: bool) -> Sizes:
    """What SGLang captures and prefills under these flags (their defaults by card class)."""
    chunk_default, bs_default = memory_defaults.class_defaults(inp.gpu.memory_total_mib, par.tp)
    given = int_of(inp.flags, "chunked-prefill-size")
    chunk = chunk_default if given is None else given  # 0 is chunking off, as -1 (memory_hook.py)
    if chunk <= 0:  # chunking off: a prompt of the whole context is prefilled in one step
        chunk = context
    running = int_of(inp.flags, "max-running-requests")
    bs = memory_defaults.decode_graph_bs(bs_default, _decode_flags(inp, layout, running))
    # SGLang captures up to the request cap, which a draft model sets when it is unset
    spec = draft_model(inp.flags) is not None
    requests = running or (SPEC_DEFAULT_REQUESTS if spec else bs)
    graphs = 0 if decode_graphs_off(inp.flags) else min(bs, requests)
    # a prefill role reserves no attention-DP padding (memory_hook.py:371-372)
    dp = 1 if _mode(inp.flags) == "prefill" else par.attn_dp
    return Sizes(graphs, chunk, graphs_measured=measured, attn_dp=dp, decode_bs=min(bs, requests))


def _graphs_estimate(inp: PlanInput, layout: KVLayout, par: Parallel, context: int) -> Part | None:
    """The decode CUDA graphs' memory a cold plan would keep free (floor.graph_gib); without the model's
    shapes (an inventory), from its layers as if its MLP were a mixture of experts (the larger term)."""
    bs = _floor_sizes(inp, layout, par, context, False).graph_bs
    found = _shapes(inp, layout, par)
    if found is not None and bs:
        return Part("CUDA graphs", graph_gib(found, bs), f"batch sizes up to {bs}, fitted to capture lines")
    layers = math.ceil(layout.layers / par.pp)
    if not bs or not layers:
        return None
    gib = GRAPH_FIT.fixed_gib + bs * layers * GRAPH_FIT.moe_kib * 1024 / GIB
    return Part("CUDA graphs", gib, f"batch sizes up to {bs} over {layers} layers, fitted to public capture "
                "lines as for a mixture of experts: the model's MLP is not known")  # fmt: skip


def _evidenced(
    inp: PlanInput,
    fraction: float,
    par: Parallel,
    shaped: tuple[PoolModel, pools.PoolSizer],
    said: tuple[list[str], tuple[str, ...]],
) -> tuple[PoolModel, tuple[str, ...]]:
    """The fitted model; a start whose cell is not this architecture's is set aside (plan/evidence.py)."""
    notes, aside = said
    try:
        return _fitted(inp, fraction, par, shaped, notes), aside
    except NotEvidence as exc:
        aside = (*aside, f"the earlier start is set aside: {exc}; it does not calibrate this plan")
        return _fitted(replace(inp, starts=(), start_ids=()), fraction, par, shaped, notes), aside


def _fitted(
    inp: PlanInput,
    fraction: float,
    par: Parallel,
    shaped: tuple[PoolModel, pools.PoolSizer],
    notes: list[str],
) -> PoolModel:
    """The pool model calibrated by the earlier starts, or by their memory lines, else cold."""
    shape = shaped[0]
    flags_for_start = {**inp.flags, "mem-fraction-static": fraction}
    starts = [s for s in (start_of(f, flags_for_start) for f in inp.starts) if s is not None]
    memory = [f for f in inp.starts if f.get("avail_mem_before_weights_gb") and _post(f)]
    if inp.starts and not starts and not memory:
        notes.append("the earlier start(s) given did not log a pool and the memory lines; not used")
    _refuse_gaps(inp, calibrated=bool(starts))
    if starts:
        return _less_neighbours(inp, par, _calibrated_as_started(inp, starts, shaped, notes), notes)
    elif memory:  # a start that died before its pool still tells pre and post
        pre, post = (
            float(memory[-1].get("avail_mem_before_weights_gb") or 0.0),
            float(_post(memory[-1]) or 0.0),
        )
        cut = partial(inp, post, par.tp)  # a start cut before the draft loaded (plan/evidence.py)
        post, why = cut if cut is not None else (post, None)
        notes.append(
            f"pre {pre:.2f} GiB and post {post:.2f} GiB from the last start's memory lines "
            "(it logged no pool: the cell is the architecture's)" + (f"; {why}" if why else "")
        )
        model = replace(shape, pre_gib=pre, post_gib=post, basis="calibrated", partial=why)
        return _less_neighbours(inp, par, model, notes)
    return _cold(inp, par, shape, notes)


def _decode_max_bs(inp: PlanInput) -> int | None:
    """The decode graphs' max batch size the flags set: a --cuda-graph-bs-decode list's largest wins over
    --cuda-graph-max-bs-decode (arg_groups/memory_hook.py:200-203)."""
    return _listed_max(inp) or int_of(inp.flags, "cuda-graph-max-bs-decode", "cuda-graph-max-bs")


def _decode_flags(inp: PlanInput, layout: KVLayout, running: int | None) -> memory_defaults.MemoryFlags:
    return memory_defaults.MemoryFlags(
        decode_max_bs=_decode_max_bs(inp),
        max_running_requests=running,
        graphs_to_running=_graphs_to_running(inp, layout),
    )


def _graphs_to_running(inp: PlanInput, layout: KVLayout) -> bool:
    """arg_groups/model_overrides/qwen3_vl.py:20-62: a Qwen3-VL that SGLang's ModelConfig takes as
    multimodal, on an SM 9.x card of 60 GiB or more, captures decode graphs up to its request cap."""
    hopper = inp.sm_major == 9 and inp.gpu.memory_total_mib >= 60 * 1024
    multimodal = layout.multimodal or _text_served_vlm(inp, layout)
    return hopper and multimodal and layout.model_type in ("qwen3_vl", "qwen3_vl_moe")


def _listed_max(inp: PlanInput) -> int | None:
    """The largest of the decode batch sizes a --cuda-graph-bs-decode list names, if it names any."""
    listed = [
        int(n)
        for n in re.findall(r"\d+", str(value_of(inp.flags, "cuda-graph-bs-decode", "cuda-graph-bs") or ""))
    ]
    return max(listed) if listed else None


def _less_neighbours(inp: PlanInput, par: Parallel, model: PoolModel, notes: list[str]) -> PoolModel:
    """A calibrated model less what processes outside the service hold now beyond what they held at its start
    (plan/overhead.py since_start). SGLang measures both free-memory figures with them resident, the one
    before the weights (distributed/bootstrap.py measure_pre_model_load_memory) and the one the pool is
    sized from (mem_cache/kv_cache_configurator.py _profile_available_bytes), so both come down by it."""
    others = since_start([g.processes for g in inp.gpus])
    if others.set_aside:
        notes.append(others.set_aside)
    if not others.gib:
        return model
    notes.append(f"less {others.why}" + (_clean_then(inp, par, model.pre_gib) if others.unknown else ""))
    said = f"less {others.gib:.2f} GiB held by {others.named}"
    return replace(
        model,
        pre_gib=model.pre_gib - others.gib,
        post_gib=model.post_gib - others.gib,
        said=(*model.said, said),
    )


def _clean_then(inp: PlanInput, par: Parallel, pre: float) -> str:
    """Whether the start's own free memory before the weights shows a clean card: the card less what a rank
    holds before it loads (plan/overhead.py), within that estimate's margin."""
    over = overhead_for(inp.gpu.name, inp.gpu.memory_gib, _rank_layout(inp, par))
    missing = inp.gpu.memory_gib - over.gib - pre
    if missing <= over.margin_gib:
        return (
            f" (the start's {pre:.2f} GiB free before the weights shows a clean card then: the card's "
            f"{inp.gpu.memory_gib:.2f} GiB less about {over.gib:.2f} GiB a rank holds)"
        )
    return (
        f" (the start had {missing:.2f} GiB less free before the weights than a clean card: what held it "
        "then comes off twice unless the facts give each process's at_start_mib)"
    )


def _calibrated_as_started(
    inp: PlanInput, starts: list[Start], shaped: tuple[PoolModel, pools.PoolSizer], notes: list[str]
) -> PoolModel:
    """Calibrated at the flags the starts ran with; a cell-changing flag since (KV dtype, page size, a draft)
    scales the measured cell by the architecture's ratio; the start's memory is kept (plan/evidence.py)."""
    fit = Fit(inp.flags, origin(inp), _figure_gaps(inp))
    then = as_started(inp)
    shape, now = shaped
    if then is None:
        return calibrated(starts, shaped, notes, fit)
    scaled = f"{SCALED_FROM} {', '.join(changed_since(then.flags, inp.flags))}"
    try:
        was = sizing(then).sizer
    except UsageError as exc:  # a draft the plan has no config.json for: its cell cannot be sized here
        gone = draft_gone(inp, removed_draft(inp, then), shape, notes, scaled)
        if gone is None:
            raise NotEvidence(f"it ran under other flags whose cell cannot be sized here ({exc})") from None
        return gone
    if was == now:  # the flags differ in name only (bf16 and a bf16 model's auto)
        return calibrated(starts, shaped, notes, fit)
    model = calibrated(starts, (replace(shape, cell_bytes=was.cell_bytes, sizer=was), was), notes, fit)
    model = _plus_removed_draft(inp, then, _less_added_draft(inp, then, model, notes), notes)
    ratio = now.cell_bytes / was.cell_bytes
    measured = model.sizer.cell_bytes if model.sizer is not None else model.cell_bytes
    sizer = replace(now, cell_bytes=measured * ratio)
    changed = ", ".join(f"--{k}" for k in changed_names(then.flags, inp.flags))
    notes.append(
        f"the start ran before {changed} changed: its cell times the architecture's ratio {ratio:.3f} "
        f"({was.cell_bytes:,.0f} to {now.cell_bytes:,.0f} B per token), its memory kept"
    )
    return replace(
        model, cell_bytes=sizer.cell_bytes, sizer=sizer, page_size=sizer.page_size, said=(*model.said, scaled)
    )


def _less_added_draft(inp: PlanInput, then: PlanInput, model: PoolModel, notes: list[str]) -> PoolModel:
    """A draft added since the start: its weights load before the pool is sized (0.5.14+,
    Scheduler.init_model_worker), so they come off the start's memory after the weights."""
    algorithm = added_draft(inp, then)
    if algorithm is None or inp.draft is None:
        return model
    draft = (inp.draft.weights_bytes or 0) / max(1, parallel(inp).tp) / GIB
    notes.append(
        f"the start ran without a draft: the {algorithm} draft's {draft:.2f} GiB per GPU come off its memory "
        "after the weights" + ("" if draft else " (unknown: the facts lack draft.weights_bytes)")
    )
    return replace(model, post_gib=model.post_gib - draft)


def _plus_removed_draft(inp: PlanInput, then: PlanInput, model: PoolModel, notes: list[str]) -> PoolModel:
    """A draft removed since the start, planned as one added is: its weights loaded before the pool was
    sized (0.5.14+, Scheduler.init_model_worker), so they come back to the memory after the weights; its KV
    leaves the cell (the architecture's ratio). Unknown weights are said: the pool then grows beyond the
    prediction, and the gate is told the start is no evidence for these flags (SCALED_FROM)."""
    algorithm = removed_draft(inp, then)
    if algorithm is None:
        return model
    draft = (
        (then.draft.weights_bytes or 0) / max(1, parallel(then).tp) / GIB if then.draft is not None else 0.0
    )
    notes.append(
        f"the start ran with a {algorithm} draft the plan drops: its {draft:.2f} GiB per GPU come back to "
        "its memory after the weights"
        + ("" if draft else " (unknown: the pool will be larger than predicted by the draft's weights)")
    )
    return replace(model, post_gib=model.post_gib + draft)


def removed_draft(inp: PlanInput, then: PlanInput | None) -> str | None:
    """The draft model's algorithm the start ran when the plan runs none."""
    if then is None or draft_model(inp.flags) is not None:
        return None
    return draft_model(then.flags)


def added_draft(inp: PlanInput, then: PlanInput | None) -> str | None:
    """The draft model's algorithm when the plan runs one and the start ran none (NGRAM loads no model)."""
    if then is None or draft_model(then.flags) is not None:
        return None
    return draft_model(inp.flags)


def _figure_gaps(inp: PlanInput) -> tuple[str, ...]:
    """The missing figures that shape the cell (the weights only matter before a first start)."""
    return tuple(g for g in inp.gaps if not g.endswith("weights_gib_per_gpu"))


def _refuse_gaps(inp: PlanInput, calibrated: bool) -> None:
    """Without a start that logged its pool, every figure the source lacks is needed: name them all."""
    if inp.gaps and not calibrated:
        raise UsageError(
            f"cannot plan {inp.name} without an earlier start: {origin(inp)} lacks " + ", ".join(inp.gaps),
            hint="add them to the host's inventory file, or pass --from-log with a start-up log of this host",
        )


def _post(figures: StartFigures) -> float | None:
    value = figures.get("avail_mem_before_pool_gb") or figures.get("avail_mem_after_weights_gb")
    return None if value is None else float(value)


def _cold(inp: PlanInput, par: Parallel, shape: PoolModel, notes: list[str]) -> PoolModel:
    """No start yet: pre = card - overhead (overhead.py), post = pre - weights per GPU (target + draft when
    the flags run one: 0.5.14+ loads the draft before sizing, Scheduler.init_model_worker)."""
    if inp.model.weights_bytes is None:
        raise UsageError(
            f"cannot plan {inp.name} without an earlier start: the facts lack model.weights_bytes",
            hint="add weights_bytes (the checkpoint's tensor bytes) or last_start (a start-up log)",
        )
    over = overhead_for(inp.gpu.name, inp.gpu.memory_gib, _rank_layout(inp, par))
    others = outside_service([g.processes for g in inp.gpus])  # other processes on the service's GPUs
    pre = inp.gpu.memory_gib - over.gib - others.gib
    shards = par.tp * par.pp
    weights = inp.model.weights_bytes / shards / GIB
    # a draft the flags drop (--set speculative-algorithm=false) loads no weights
    loaded = inp.draft if draft_model(inp.flags) is not None else None
    draft = (loaded.weights_bytes or 0) / par.tp / GIB if loaded is not None else 0.0
    notes.append(
        f"cold estimate: {over.why}; weights {weights:.2f} GiB per GPU"
        + (f" + draft {draft:.2f} GiB" if draft else "")
        + (f"; less {others.why}" if others.why else "")
        + (f"; {others.set_aside}" if others.set_aside else "")
    )
    if _image_quick_reduce(inp) and "quick all-reduce" in over.why:
        notes.append(
            f"SGLang {inp.sglang_version}'s ROCm images open quick all-reduce without the unit asking (4 GiB "
            "more before the weights than 0.5.8.post1's): counted; set ROCM_QUICK_REDUCE_QUANTIZATION=NONE "
            "in [unit.environment] where this host's image does not"
        )
    return replace(shape, pre_gib=pre, post_gib=pre - weights - draft, margin_gib=over.margin_gib)


def _image_quick_reduce(inp: PlanInput) -> bool:
    """An AMD host whose SGLang release's images open quick all-reduce, and whose unit leaves it unset."""
    unset = "ROCM_QUICK_REDUCE_QUANTIZATION" not in inp.env
    return unset and is_amd(inp.gpu.name) and release_quick_reduce(sglang_version(inp))


def _rank_layout(inp: PlanInput, par: Parallel) -> RankLayout:
    attn_tp = par.attn_tp if par.attn_dp > 1 else None
    return RankLayout(par.tp, par.pp, attn_tp, _custom_ar(inp), _quick_reduce_gib(inp))


def _custom_ar(inp: PlanInput) -> bool:
    """Whether SGLang sets up the (aiter, on ROCm) custom all-reduce: --disable-custom-all-reduce and
    SGLANG_USE_AITER_AR=0 (distributed/device_communicators/custom_all_reduce.py) turn the aiter one off."""
    off = "disable-custom-all-reduce" in inp.flags and is_on(inp.flags, "disable-custom-all-reduce")
    return not off and inp.env.get("SGLANG_USE_AITER_AR", "true") not in OFF


def _quick_reduce_gib(inp: PlanInput) -> float:
    """ROCm quick all-reduce: on with ROCM_QUICK_REDUCE_QUANTIZATION in FP/INT8/INT6/INT4, or unset under a
    release whose images set it (overhead.py release_quick_reduce); its max problem size is
    ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB, else 2 GiB (device_communicators/quick_all_reduce.py)."""
    quant = inp.env.get("ROCM_QUICK_REDUCE_QUANTIZATION", "IMAGE" if _image_quick_reduce(inp) else "NONE")
    if quant not in ("FP", "INT8", "INT6", "INT4", "IMAGE"):
        return 0.0
    try:
        mib = int(inp.env.get("ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB", "0"))
    except ValueError:
        mib = 0
    return mib / 1024 if mib > 0 else 2.0
