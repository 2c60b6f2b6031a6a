"""The effective configuration: the one set of flags a command sizes, prints and renders.

It is the inventory's [sglang.flags] with the person's --set over them (a --set spelling replaces every
spelling of its flag, flagrules.canonical), and the inventory's per-GPU weights restated at the effective
TP x PP: `weights_gib_per_gpu` describes the checkpoint at the inventory's own layout, so a --set tp-size=4
of a unit written for TP 8 doubles them (the facts path does the same with the checkpoint's bytes). What
SGLang 0.5.23 resolves for a flag left unset is resolved where the pool is sized (plan/choose.py for
--max-running-requests, plan/predict.py for --mem-fraction-static), and the plan says it (Plan.flags,
Plan.resolved). Built once per command (agent/apply.py effective_of) and passed down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import RenderError
from agent.inventory import FlagValue, HostConfig
from agent.sglang import server_args
from agent.sglang.flagrules import canonical
from agent.sglang.flags import FlagInput

SetFlags = tuple[tuple[str, FlagInput], ...]


@dataclass(frozen=True)
class Effective:
    """The inventory as it will run: --set over its flags, its weights per GPU at the effective layout."""

    host: HostConfig
    given: SetFlags = ()  # --set FLAG=VALUE as the person gave them (rendered as given)
    inventory_flags: Mapping[str, FlagValue] | None = None  # [sglang.flags] before --set

    @property
    def flags(self) -> Mapping[str, FlagValue]:
        return self.host.sglang.flags


TP_NAMES = ("tp-size", "tensor-parallel-size", "tp")
PP_NAMES = ("pp-size", "pipeline-parallel-size", "pp")


def world(flags: Mapping[str, object]) -> tuple[int, int]:
    """(tp, pp) as SGLang 0.5.23 reads them, every spelling: both default to 1 (server_args.py), as the unit
    renders no --tp-size it was not given. The one reading of the layout every planner step uses."""

    def number(names: tuple[str, ...]) -> int:
        name, value = next(((n, flags[n]) for n in names if flags.get(n) not in (None, False)), ("", 1))
        try:
            return int(str(value))
        except ValueError:  # a command checks its flags first (check_table): one that did not, one line
            raise RenderError(f"--{name} {value!r} is not an integer") from None

    return number(TP_NAMES), number(PP_NAMES)


def one_word(value: FlagInput) -> FlagValue:
    """A --set value as the planner reads it: several words joined."""
    return " ".join(value) if isinstance(value, tuple) else value


def check_table(host: HostConfig, flags: Mapping[str, FlagInput], named: str = "flags.") -> None:
    """Every flag against SGLang's own table (agent/sglang/server_args.py): the inventory's baseline flags
    that `flags` leave in place, then `flags`; the first one SGLang would refuse raises RenderError, named
    where the person wrote it (`named`: "--set " for a command's --set, as a facts file's plan says it)."""
    baseline = {k: v for k, v in host.sglang.flags.items() if k not in flags}
    for field, flagset in (("sglang.flags.", baseline), (named, flags)):
        for name, said in server_args.problems(host.sglang.version, flagset):
            raise RenderError(f"{field}{name}: {said}")


def effective_of(host: HostConfig, given: SetFlags) -> Effective:
    """A command's effective configuration, built once: SGLang's flag table refuses a bad --set first (a
    typo is not planned for, and no connection is made for it)."""
    check_table(host, dict(given), "--set ")
    return effective(host, given)


def at_layout(host: HostConfig, written: HostConfig) -> HostConfig:
    """`host` (its own flags) with the weights per GPU that `written` states at its own TP x PP restated at
    host's: TP 4 of a checkpoint written for TP 8 doubles them; a draft is split over TP alone. Used by
    --set and by each [pd] role's own flags (agent/pd/units.py)."""
    before, after = world(written.sglang.flags), world(host.sglang.flags)
    if before == after:
        return host
    update: dict[str, object] = {}
    ratio = before[0] * before[1] / (after[0] * after[1])
    w = written.model.weights_gib_per_gpu
    if w is not None:
        update["model"] = host.model.model_copy(update={"weights_gib_per_gpu": w * ratio})
    d = written.draft
    if d is not None and d.weights_gib_per_gpu is not None and host.draft is not None:
        update["draft"] = host.draft.model_copy(
            update={"weights_gib_per_gpu": d.weights_gib_per_gpu * before[0] / after[0]}
        )
    return host.model_copy(update=update)


def effective(host: HostConfig, given: SetFlags) -> Effective:
    """The inventory with --set over its flags and its weights restated at the effective TP x PP."""
    if not given:
        return Effective(host, (), host.sglang.flags)
    version = host.sglang.version
    extra = {k: one_word(v) for k, v in given}
    names = {canonical(k, version) for k in extra}
    kept = {k: v for k, v in host.sglang.flags.items() if canonical(k, version) not in names}
    flags = {**kept, **extra}
    moved = at_layout(
        host.model_copy(update={"sglang": host.sglang.model_copy(update={"flags": flags})}), host
    )
    return Effective(moved, tuple(given), host.sglang.flags)


# A context below this is a typo, not a plan (--context 128 for 128k): no chat turn fits in it.
MIN_CONTEXT = 1000
SHRINK_FACTOR = 8  # a target this many times below the served context is a slip of the unit, not a plan


def context_refusal(target: int, served: int | None, shrink: bool) -> str | None:
    """Why a target context is refused before planning, in one line; None when it is planned.

    A target below MIN_CONTEXT is refused; one at an eighth or less of the context the unit serves now is
    a unit slip (the "k" forgotten divides by 1,000) unless --shrink-context says it is meant. A smaller
    shrink is planned and said (context_shrink): the smoke test shrinks its prompt to fit, so nothing else
    would notice it."""
    if target < MIN_CONTEXT:
        return (
            f"--context {target:,} is implausibly small (below {MIN_CONTEXT:,} tokens): "
            f"did you mean {target}k?"
        )
    if served is not None and target * SHRINK_FACTOR <= served and not shrink:
        return (
            f"--context {target:,} is an eighth or less of the {served:,} tokens the unit serves now"
            f"{_forgotten_k(target, served)}; pass --shrink-context to mean it"
        )
    return None


def _forgotten_k(target: int, served: int) -> str:
    """The hint, where a "k" forgotten is a likely slip: the context meant (x 1,000) is within a shrink
    factor of the one served. Gemma 3's 128,000 under SGLang's 1,048,576 (131,072 x its linear RoPE
    factor 8, utils/hf_transformers/common.py:677-694 get_context_length) would mean 128M: no slip."""
    return " (a forgotten k?)" if target * 1000 <= served * SHRINK_FACTOR else ""


def context_shrink(target: int, served: int | None) -> str | None:
    """The warning a plan carries when its context is below the one the unit serves now."""
    if served is None or target >= served:
        return None
    return f"the served context shrinks from {served:,} to {target:,} tokens: longer prompts will be refused"
