"""Pure: whether a [pd] unit whose role changes is switched in place (SGLang's `POST /pd_role_switch`) or
restarted, and what SGLang's answer to a switch means for the change.

SGLang 0.5.23 flips a running server between prefill and decode without a restart when it was started with
`--enable-pd-role-switch` (srt/arg_groups/fields/disagg.py:121); the token KV pool is kept, only the
role's disaggregation structures are rebuilt (srt/disaggregation/role_switch.py). It rejects a switch
(role_switch.py:169 `_reject_reason`, tokenizer_control_mixin.py:926) when the flag is not set, the server
is not in PD mode, its transfer backend's KV manager has no `supports_role_switch` (mooncake and mori only:
mooncake/conn.py:258, mori/conn.py:375, base/conn.py:160), the staging buffer is on
(`SGLANG_DISAGG_STAGING_BUFFER`), or the server is not idle; a switch to decode from a server without
decode CUDA graphs (a prefill: launched eager) needs `decode_cuda_graph_memory_gb`, "measured graph
footprint from a matching decode peer" (io_struct.py:2272, role_switch.py:85). The bootstrap server runs on
every role-switch instance from its start and is not rebuilt on a flip (managers/disagg_service.py:26), so
a prefill switched in keeps the bootstrap port its start bound.

deployctl switches only what it knows SGLang takes: the running unit is its installed unit, started with
the flag, and the new unit differs from it in the role alone (`--disaggregation-mode`, and
`--disaggregation-bootstrap-port` being the one its start bound, in either direction), and a decode
switched to prefill only when its start ran the radix cache its prefill unit runs. Anything else restarts,
with one line saying why not a switch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.sglang.flags import FlagsError, FlagValue, parse_unit_flags, unit_lines
from agent.sglang.roleswitch import Answer, Said, answer

FLAG = "enable-pd-role-switch"
MODE = "disaggregation-mode"
BOOTSTRAP = "disaggregation-bootstrap-port"
BOOTSTRAP_DEFAULT = 8998  # srt/arg_groups/fields/disagg.py
ROLES = ("prefill", "decode")
# their KV managers set supports_role_switch (base/conn.py:160); mooncake_tcp is mooncake
# (pd_disaggregation_hook.py:27), ascend's manager is Mooncake's (ascend/conn.py:95)
SWITCHING_BACKENDS = ("mooncake", "mooncake_tcp", "mori", "ascend")
STAGING = "SGLANG_DISAGG_STAGING_BUFFER"
_TRUE = ("1", "true", "yes", "on")  # SGLang's env bool (srt/environ.py)


@dataclass(frozen=True)
class Running:
    """What deployctl knows of the unit as it runs: its installed text, and whether its server runs that
    text (active, its start not older than the file: the agent's compare)."""

    text: str | None
    as_written: bool


@dataclass(frozen=True)
class Switch:
    old_role: str
    new_role: str
    bootstrap_port: int | None  # a prefill's, for the router; None for a decode
    graph_peer: str | None  # switching to decode: the decode whose measured graph memory SGLang needs

    @property
    def line(self) -> str:
        return f"switch: {self.old_role} -> {self.new_role} through POST /pd_role_switch, no restart"


@dataclass(frozen=True)
class Restart:
    why: str  # the reason it is not a switch

    @property
    def line(self) -> str:
        return f"restart: {self.why}"


def running_of(facts: Mapping[str, object]) -> Running:
    """From a unit's facts: its installed text, and whether its server runs that text: active and running,
    systemd's copy not older than the file, and its start one that deployctl made of this very text (its
    history: the start's invocation with the text's sha256). Unknown counts as not."""
    text, sha = facts.get("unit_text"), facts.get("unit_sha256")
    state = facts.get("state")
    history = facts.get("history")
    if not isinstance(text, str) or not isinstance(state, Mapping) or not isinstance(history, list):
        return Running(text if isinstance(text, str) else None, False)
    live = state.get("active_state") == "active" and state.get("sub_state") == "running"
    live = live and not state.get("need_daemon_reload")
    invocation = state.get("invocation_id")
    ours = any(isinstance(e, Mapping) and (e.get("sha256"), e.get("invocation")) == (sha, invocation)
               for e in history)  # fmt: skip
    return Running(text, bool(live and invocation and ours))


def _router_words(text: str) -> tuple[list[str], dict[str, str], set[str]]:
    """The router's ExecStart words without its units, its prefills (URL -> bootstrap port) and decodes."""
    words = next((v.split() for s, k, v in unit_lines(text) if s == "Service" and k == "ExecStart"), [])
    words += ["--"]  # a stop, so that a word after the last one always exists
    rest: list[str] = []
    prefills: dict[str, str] = {}
    decodes: set[str] = set()
    i = 0
    while i < len(words) - 1:
        word, after = words[i], words[i + 1]
        if word == "--prefill":
            port = words[i + 2] if i + 2 < len(words) and not words[i + 2].startswith("--") else ""
            prefills[after] = port
            i += 3 if port else 2
        elif word == "--decode":
            decodes.add(after)
            i += 2
        else:
            rest.append(word)
            i += 1
    return rest, prefills, decodes


def router_keeps(installed: str | None, new: str, switched: Mapping[str, tuple[str, int | None]]) -> bool:
    """Whether the router's unit changes by the switched units alone (URL -> new role and a prefill's
    bootstrap port): then the running router is told through its API, and its unit is written, not
    restarted. Anything else in its unit that changes restarts it, as any unit."""
    if installed is None or not switched:
        return False
    old_rest, prefills, decodes = _router_words(installed)
    new_rest, new_prefills, new_decodes = _router_words(new)
    for url, (role, port) in switched.items():
        prefills.pop(url, None)
        decodes.discard(url)
        if role == "prefill":
            prefills[url] = str(port)
        else:
            decodes.add(url)
    same_lines = _besides_exec(installed) == _besides_exec(new)
    return same_lines and old_rest == new_rest and prefills == new_prefills and decodes == new_decodes


def _besides_exec(text: str) -> list[tuple[str, str, object]]:
    """The router's lines but its command; its After= as a set (the roles' units, listed in role order)."""
    return [
        (s, k, frozenset(v.split()) if k == "After" else v)
        for s, k, v in unit_lines(text)
        if k != "ExecStart"
    ]


def _mode(flags: dict[str, FlagValue]) -> str:
    value = flags.get(MODE)
    return value if isinstance(value, str) else "null"


def _bootstrap(flags: dict[str, FlagValue]) -> int | None:
    value = flags.get(BOOTSTRAP, str(BOOTSTRAP_DEFAULT))
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _staging(text: str) -> bool:
    """The staging buffer on in the unit's environment (SGLang refuses a switch with it)."""
    for section, key, value in unit_lines(text):
        if section == "Service" and key == "Environment":
            for word in value.replace('"', " ").split():
                name, _, setting = word.partition("=")
                if name == STAGING and setting.lower() in _TRUE:
                    return True
    return False


def _without_role(text: str) -> str:
    """The unit with its ExecStart's role words left out, and its comments and Description= (they name
    the role and its index): what must be equal for a switch."""
    lines = []
    for line in text.split("\n"):
        if line.startswith(("#", "Description=")):
            continue
        words = line.split()
        kept, skip = [], False
        for word in words:
            if skip:
                skip = False
                continue
            if word in (f"--{MODE}", f"--{BOOTSTRAP}"):
                skip = True
                continue
            if word.startswith((f"--{MODE}=", f"--{BOOTSTRAP}=")):
                continue
            kept.append(word)
        lines.append(" ".join(kept))
    return "\n".join(line for line in lines if line not in ("", "\\"))


def _other_change(old: dict[str, FlagValue], new: dict[str, FlagValue]) -> str:
    """The first flag that differs besides the role, in a few words."""
    for name in [*old, *(n for n in new if n not in old)]:
        if name in (MODE, BOOTSTRAP) or old.get(name) == new.get(name):
            continue
        return f"--{name} changes too ({old.get(name, 'unset')} -> {new.get(name, 'unset')})"
    return "its unit changes besides its role"


def decide(running: Running, new_text: str, graph_peer: str | None) -> Switch | Restart | None:
    """A switch, a restart with why not a switch, or None when the role does not change (an ordinary
    restart, nothing to say). SGLang's own checks, in its order, as far as the unit tells them."""
    if running.text is None:
        return None
    try:
        old, new = parse_unit_flags(running.text), parse_unit_flags(new_text)
    except FlagsError:
        return None
    was, to = _mode(old), _mode(new)
    if was == to or to not in ROLES:
        return None
    refused = _why_not(running, old, new, new_text)
    if refused is not None:
        return refused
    if to == "decode" and graph_peer is None:
        return Restart(_NO_PEER)
    return Switch(
        was, to, _bootstrap(new) if to == "prefill" else None, graph_peer if to == "decode" else None
    )


_NO_PEER = (
    "no decode of the service stays running to measure the decode CUDA graph memory SGLang needs to "
    "switch to decode (decode_cuda_graph_memory_gb)"
)


def _why_not(
    running: Running, old: dict[str, FlagValue], new: dict[str, FlagValue], new_text: str
) -> Restart | None:
    assert running.text is not None
    backend = old.get("disaggregation-transfer-backend", "mooncake")
    checks = (
        (not running.as_written, "the running server is not its installed unit, so its flags are unknown"),
        (old.get(FLAG) is not True, f"--{FLAG} not set on the running unit"),
        (_mode(old) not in ROLES, "the running unit is not in PD mode"),
        (backend not in SWITCHING_BACKENDS,
         f"transfer backend {backend!r} does not support a runtime role switch (SGLang: mooncake, mori, "
         "ascend)"),
        (_staging(running.text), f"{STAGING} is on in the running unit (SGLang refuses a switch with it)"),
        (_without_role(running.text) != _without_role(new_text), _other_change(old, new)),
        # every role-switch instance binds its bootstrap server at start and a flip never rebuilds it
        # (managers/disagg_service.py:26): either way the new unit must name the port bound
        (_bootstrap(new) != _bootstrap(old),
         f"its bootstrap server listens on {_bootstrap(old)} since its start (a switch does not rebuild "
         f"it), the new {_mode(new)}'s --{BOOTSTRAP} is {_bootstrap(new)}"),
        (_radix_lost(old, new), _NO_RADIX),
    )  # fmt: skip
    return next((Restart(why) for failed, why in checks if failed), None)


def _radix_lost(old: dict[str, FlagValue], new: dict[str, FlagValue]) -> bool:
    """A decode switched to prefill without the radix cache its prefill unit runs: a decode resolves
    disable_radix_cache=True at its start unless --disaggregation-decode-enable-radix-cache
    (arg_groups/pd_disaggregation_hook.py:98-126), and a switch only resets the tree it has
    (disaggregation/role_switch.py:266-294), never builds one."""
    return (
        _mode(old) == "decode"
        and _mode(new) == "prefill"
        and new.get(NO_RADIX) is not True
        and old.get(DECODE_RADIX) is not True
    )


NO_RADIX = "disable-radix-cache"
DECODE_RADIX = "disaggregation-decode-enable-radix-cache"
_NO_RADIX = (
    "a decode starts without a radix cache (no --disaggregation-decode-enable-radix-cache) and a switch "
    "does not build one: the new prefill would run without the prefix cache its unit gives it"
)


Decision = Switch | Restart | None

SGL_13054 = "a prefill restarts in this change: a decode re-registers with it by a restart (sglang#13054)"
ROUTER_RESTARTS = (
    "the router restarts (its unit changes besides the switched roles), so does every role change"
)


@dataclass(frozen=True)
class Settled:
    decisions: list[Decision]  # per role unit, in the order given
    router_keeps: bool  # the router's unit is written without a restart


def settle(
    decisions: list[Decision], urls: list[str | None], prefill_restarts: bool, router: tuple[str | None, str]
) -> Settled:
    """The switches of one change together: a switch to decode restarts when a prefill restarts; the
    router's unit must change by the switches alone (router_keeps), else it restarts and every role
    change with it (a router that restarts registers every unit from its command line)."""
    decisions = [
        Restart(SGL_13054) if isinstance(d, Switch) and d.new_role == "decode" and prefill_restarts else d
        for d in decisions
    ]
    switched = {u: (d.new_role, d.bootstrap_port) for d, u in zip(decisions, urls, strict=True)
                if isinstance(d, Switch) and u is not None}  # fmt: skip
    if any(isinstance(d, Switch) for d, u in zip(decisions, urls, strict=True) if u is None):
        return Settled([Restart("the router does not name it by a URL") if isinstance(d, Switch) else d
                        for d in decisions], False)  # fmt: skip
    installed, new = router
    keeps = router_keeps(installed, new, switched)
    if switched and not keeps and installed != new:
        decisions = [Restart(ROUTER_RESTARTS) if isinstance(d, Switch) else d for d in decisions]
    return Settled(decisions, keeps)


__all__ = ["Answer", "Restart", "Running", "Said", "Settled", "Switch", "answer", "decide", "settle"]
