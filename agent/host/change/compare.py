"""The compare step of the host transaction, changing nothing: the installed unit against the request (up to
date, refused, or the secret files the new unit needs), SGLang's own parser on the new flags, and a start of
this very unit already in progress, followed to its verdict rather than restarted."""

from __future__ import annotations

from agent.host.adopt import kept_secret_env
from agent.host.change.decide import Action, Gate
from agent.host.change.ports import Ports, Result
from agent.host.roles.pdrouter import is_router
from agent.host.watch.start import WatchedStart, watch_start
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Outcome, Stage
from agent.sglang.logs.summary import summarize


def check_with_sglang(p: Ports, new: str) -> Result | None:
    """Validate before install: the host's own SGLang parser reads the new flags (host/argcheck.py)."""
    from agent.host.argcheck import Verdict, check_unit

    checked = check_unit(new)
    if checked.verdict is Verdict.REFUSED:
        msg = f"SGLang's own argument parser refuses the new flags: {checked.detail}"
        p.log.emit(Stage.COMPARE, "warning", msg)
        return Result(Outcome.ERROR, msg + "; nothing changed")
    said = checked.detail if checked.verdict is Verdict.ACCEPTED else f"flag check skipped: {checked.detail}"
    p.log.emit(Stage.COMPARE, "step", said)
    return None


def compare(p: Ports, wait: bool = True) -> Result | dict[str, str | None]:
    """The installed unit against the request: a Result when there is nothing to do (up to date, left
    stopped, or refused), else the secret files the new unit needs. It changes nothing (but see
    rewrite_daemon).

    wait: a start of this very unit that systemd began and that is still in progress is waited for
    (bounded by the gate's timeouts) rather than restarted; False (a check) hands that to the caller.
    """
    assert p.req.unit_text is not None
    new = p.req.unit_text
    current = p.files.read(p.unit)
    # An empty file is no unit (systemd masks it): the laptop that saw it may say "absent".
    seen = {sha256(current), *(("absent",) if not current else ())} if current is not None else {"absent"}
    if p.req.expect_sha256 is not None and p.req.expect_sha256 not in seen:
        msg = f"{p.files.path(p.unit)} changed on the host since it was planned (edited by hand?)"
        p.log.emit(Stage.COMPARE, "warning", msg)
        return Result(Outcome.ERROR, msg + "; nothing changed: re-run to plan against it")
    secrets = wanted_secrets(p, current)
    if isinstance(secrets, Result):
        return secrets
    same = current == new and p.secrets.current() == secrets
    repair = p.daemon.drift(p.req.daemon_text)  # [weight_cache]: its daemon's unit deleted or edited by hand
    if repair is not None:
        p.log.emit(Stage.COMPARE, "warning", repair)
        same = same and wait and rewrite_daemon(p)
    if same and p.req.group is None and not p.req.start and stopped(p):
        return left_stopped(p)
    # A node of a group restarts with the others even when its own unit is unchanged: the laptop asks
    # only when some rank needs it, and one rank cannot restart alone.
    if same and running_as_installed(p) and p.req.group is None:
        done = in_place(p, sha256(new), wait)
        if done is not None:
            return done
    return secrets


def in_place(p: Ports, sha: str, wait: bool) -> Result | None:
    """The installed unit runs as sent: UP_TO_DATE when it needs nothing (its pool meets the target; a
    [pd] router, which has none, by running), else None (the change restarts it)."""
    said = None
    if is_router(p):
        said = f"{p.unit} is already up to date and running: nothing to do"
    elif met_target(p, sha):
        said = f"{p.unit} is already up to date and its pool meets the target: nothing to do"
    if said is not None:
        p.log.emit(Stage.COMPARE, "step", said)
        return Result(Outcome.UP_TO_DATE, said)
    return wait_for_start(p) if wait and starting(p) else None


def wanted_secrets(p: Ports, current: str | None) -> Result | dict[str, str | None]:
    """The secret files the new unit needs: the request's, and the kept variables' values on the host."""
    kept = kept_secret_env(p.req.keep_secret_env, p.secrets.current()["env"], current)
    missing = [n for n in p.req.keep_secret_env if n not in kept]
    if missing:
        msg = f"no value on the host for the kept secret variable(s) {', '.join(missing)}"
        p.log.emit(Stage.COMPARE, "warning", msg)
        return Result(Outcome.ERROR, msg + "; nothing changed: set them in the inventory's environment")
    return p.secrets.wanted({**kept, **p.req.secret_env}, p.req.secret_flags)


def rewrite_daemon(p: Ports) -> bool:
    """An apply (never a check: wait=False) where only the daemon's file differs, and the daemon runs the
    text sent: written back and reloaded, no restart (a model load for a file nothing runs); the
    hand-edited file is kept in the state folder. False: the change repairs it."""
    if p.req.group is not None or not running_as_installed(p):
        return False
    stamp = p.now().strftime("%Y%m%dT%H%M%SZ")
    keep_as = p.state.unit_dir(p.unit) / f"{p.daemon.name}.edited.{stamp}"
    if not p.daemon.rewrite(p.req.daemon_text, keep_as, p.systemd.daemon_reload):
        return False
    p.log.emit(Stage.COMPARE, "step", f"{p.daemon.name} runs deployctl's unit: its file was written back "
               f"and reloaded, nothing restarted (the edited file is kept at {keep_as})")  # fmt: skip
    return True


def left_stopped(p: Ports) -> Result:
    """An unchanged unit someone stopped stays stopped unless the person asked (apply --start)."""
    msg = (
        f"{p.unit} is up to date but stopped (inactive, not failed): left stopped, as someone stopped it; "
        "`deployctl apply HOST --start` starts it"
    )
    p.log.emit(Stage.COMPARE, "warning", msg)
    return Result(Outcome.UP_TO_DATE, msg)


def stopped(p: Ports) -> bool:
    """Stopped on purpose: inactive (a stop), not failed (a crash, which an apply repairs), and loaded."""
    s = p.systemd.unit_state(p.unit)
    return s.active_state == "inactive" and s.load_state == "loaded"


def starting(p: Ports) -> bool:
    """The running start (systemd's own: a reboot, Restart=) logged, but neither ready nor a failure."""
    lines = p.journal.last_invocation_lines(p.unit, 20000)
    figures = summarize(lines).to_dict() if lines else {}
    return bool(lines) and not figures.get("ready") and not figures.get("failure")


def wait_for_start(p: Ports) -> Result | None:
    """Follow the start in progress to its verdict: UP_TO_DATE when it serves a pool that meets the
    target, None (restart it, as before) when it fails, falls short or never answers."""
    from agent.host.watch.probe import ProbeError

    p.log.emit(Stage.COMPARE, "step", f"{p.unit} is starting as installed: waiting for that start")
    state = p.systemd.unit_state(p.unit)
    gate = Gate(p.req.target_context, None, 0.0, p.req.timeouts)
    watched = WatchedStart(p.unit, p.journal, p.systemd, gate, None, state.invocation_id, state.n_restarts)
    started = watch_start(watched, p.log, Stage.WATCH)
    if started.verdict.action is not Action.READY:
        p.log.emit(Stage.COMPARE, "warning", f"the start in progress failed: {started.verdict.reason}")
        return None
    try:
        p.http().wait_ready(p.req.timeouts.ready_s)
    except ProbeError as exc:
        p.log.emit(Stage.COMPARE, "warning", f"the start in progress does not answer: {exc}")
        return None
    pool = int(started.summary.get("kv_tokens") or 0)
    msg = f"{p.unit}: the start in progress is ready with a KV pool of {pool:,} tokens: nothing to do"
    p.log.emit(Stage.COMPARE, "step", msg)
    return Result(Outcome.UP_TO_DATE, msg, {"summary": started.summary})


def running_as_installed(p: Ports) -> bool:
    s = p.systemd.unit_state(p.unit)
    return bool(s.active_state == "active" and s.sub_state == "running" and not s.need_daemon_reload)


def met_target(p: Ports, sha: str) -> bool:
    """The running start of this very unit logged a pool that meets the target, and is serving."""
    invocation = p.systemd.unit_state(p.unit).invocation_id
    target = p.req.target_context or 0
    history = [e for e in p.state.history(p.unit) if e.get("sha256") == sha]
    for entry in reversed(history):
        if entry.get("invocation") == invocation:
            return int(entry.get("kv_tokens") or 0) >= target
    # Not started by deployctl (or its history is gone): believe the running start's own log.
    lines = p.journal.last_invocation_lines(p.unit, 20000)
    figures = summarize(lines).to_dict() if lines else {}
    kv_tokens = figures.get("kv_tokens")
    if kv_tokens:
        return bool(figures.get("ready")) and int(kv_tokens) >= target
    if history:
        # This start's log is gone (a reboot, then the journal rotated): the same unit's verified
        # start, kept in our own state, stands for it rather than a restart for nothing.
        entry = history[-1]
        p.log.emit(
            Stage.COMPARE,
            "step",
            f"this start's log is gone; the same unit's start verified in {entry.get('txn')} "
            f"logged a pool of {int(entry.get('kv_tokens') or 0):,} tokens",
        )
        return int(entry.get("kv_tokens") or 0) >= target
    return False
