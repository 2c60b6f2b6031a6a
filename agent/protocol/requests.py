"""What the laptop sends: a Request (JSON), one per agent conversation, and its settings.

The agent validates every Request again, because the SSH wire is an edge too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field

from agent.protocol.common import (
    BACKUP_NAME,
    HTTP_URL,
    SURROGATE,
    TXN_ID,
    UNIT_NAME,
    VERSION,
    ProtocolError,
    find_control,
)

RESTART_JOB_TIMEOUT_S = 300.0  # systemd's restart (or stop) job, as the host's transaction waits for it
ANSWER_TIMEOUT_S = 300.0  # a read-only verb's answer (facts reads headers, status a few files)
SLACK_S = 600.0  # the agent's own steps between the timed phases (files, reloads, the smoke's tokenizer)


# [weight_cache]: a daemon that crashes while a start is checked is waited for (up to weights_s, its load),
# and the engine start its return makes is watched and checked again, this many times at most
# (host/change/settle.py); an engine stopped with its daemon is started by systemd within ENGINE_BACK_S.
MAX_RESTARTS_UNDER_CHECK = 3
ENGINE_BACK_S = 60.0


def conversation_bound_s(req: Request) -> float:
    """The longest one agent conversation can take: an answer, then a change whose every phase ran to its
    timeout (pre-warm, a recovery's restore first, the wait for another service's start on the host
    (host_start_wait_s), the new start, the rollback's start, the smoke test), and the starts re-checked
    after a weight-cache daemon's crash, each after the daemon's wait."""
    t = req.timeouts
    one_start = RESTART_JOB_TIMEOUT_S + t.weights_s + t.pool_s + t.ready_s
    waited = host_start_wait_s(t, req.smoke.timeout_s)
    rechecked = MAX_RESTARTS_UNDER_CHECK * (one_start + t.weights_s + ENGINE_BACK_S + req.smoke.timeout_s)
    return ANSWER_TIMEOUT_S + t.weights_s + waited + 3 * one_start + req.smoke.timeout_s + rechecked + SLACK_S


HOST_START_WAIT_MIN_S = 60.0  # a change with short timeouts still waits a minute for another's start


def host_start_wait_s(t: Timeouts, smoke_s: float | None = None) -> float:
    """How long a change whose unit pins host memory waits for another service's change on the same host
    (host/change/pinning.py): as long as that change may hold the host's lock within the same bounds, its
    pre-warm, its new start, the rollback's start of the old unit and its smoke test (a first change that
    rolls back or pre-warms does not fail the second), at least a minute."""
    one_start = RESTART_JOB_TIMEOUT_S + t.weights_s + t.pool_s + t.ready_s
    smoke = Smoke().timeout_s if smoke_s is None else smoke_s
    return max(HOST_START_WAIT_MIN_S, t.weights_s + 2 * one_start + smoke)


VERBS = (
    "facts",
    "apply",
    "compare",
    "rollback",
    "backups",
    "status",
    "recover",
    "follow",
    "inspect",
    "signal",
)
# What a unit runs: an SGLang server, or a [pd] service's router (host/roles/pdrouter.py: no pool to gate)
ENGINE_KIND, ROUTER_KIND = "engine", "router"
KINDS = (ENGINE_KIND, ROUTER_KIND)
# A multi-node service's coordinator to one node's transaction (agent/host/roles/groupsignal.py).
SIGNALS = ("go", "go-back", "commit", "abort")


@dataclass(frozen=True)
class Smoke:
    enabled: bool = True
    prompt_tokens: int = 60000
    sentence: str = "The quick brown fox jumps over the lazy dog. "
    question: str = "In one word, what animal is mentioned?"
    expect: str = "dog"
    timeout_s: float = 900.0
    load: int = 0  # the load check: prompts of chunked-prefill size sent with one at the target context


@dataclass(frozen=True)
class Group:
    """One node's part in a change of a multi-node service: the node stops, waits for the coordinator's
    "go" (every rank stopped), starts, votes, and waits for "commit" or "abort". Without a signal within
    wait_s the node rolls itself back: a group converges on the old units when its coordinator is gone."""

    rank: int
    nnodes: int
    wait_s: float = 3600.0
    # a rank's server exits when a peer's stops (a [nodes] group's collective); a [pd] group has none, so a
    # member's server outliving rank 0's deadline proves nothing (protocol/groupmachine.py)
    collective: bool = True
    # the group's change, the same for every member ("": the node's txn, which a [nodes] group shares): a
    # member does not wait for the host's memory lock that a member of its own group holds
    key: str = ""


@dataclass(frozen=True)
class Timeouts:
    weights_s: float = 1800.0
    pool_s: float = 600.0
    ready_s: float = 900.0
    no_progress_s: float = 600.0


@dataclass(frozen=True)
class Request:
    verb: str
    unit: str = "sglang.service"
    unit_dir: str = "/etc/systemd/system"
    state_dir: str = "/var/lib/deployctl"
    unit_text: str | None = None  # apply: the rendered unit
    daemon_text: str | None = None  # apply, [weight_cache]: the weight-cache daemon's unit, written beside it
    target_context: int | None = None  # apply: the pool must hold at least this many tokens
    planned_pool: int | None = None  # apply: what the plan predicted
    pool_calibrated: bool = False  # apply: planned_pool was calibrated on this host's own starts
    planned_host_pool: int | None = None  # apply, HiCache: the host pool per rank the plan sized, in tokens
    host_budget_pinned: int | None = None  # apply, HiCache: the host memory the plan's budget pins, bytes
    host_budget_capacity: int | None = None  # ... of what the host (or its slice) has for it, bytes
    margin: float = 0.02
    http_host: str = "127.0.0.1"
    port: int = 30000
    smoke: Smoke = field(default_factory=Smoke)
    timeouts: Timeouts = field(default_factory=Timeouts)
    keep_backups: int = 10
    backup: str | None = None  # rollback --to
    expect_sha256: str | None = None  # the installed unit the plan saw; a hand edit since is refused
    txn: str | None = None  # follow, status: that transaction; apply, rollback: the id the caller chose
    detach: bool = True  # run the transaction in its own transient unit
    secret_names: tuple[str, ...] = ()
    # apply: secret values, never in the unit: environment variables (EnvironmentFile=) and SGLang flags
    # (a --config file passed as a systemd credential), written root-only under secrets_dir
    secret_env: dict[str, str] = field(default_factory=dict)
    secret_flags: dict[str, str] = field(default_factory=dict)
    secrets_dir: str = "/etc/deployctl/secrets"
    # apply: secret variables whose values stay on the host (an adopted unit's): taken from what it has
    keep_secret_env: tuple[str, ...] = ()
    host_name: str = ""  # the inventory's name for the host: the metrics' host label
    prewarm: bool = True  # read the new unit's weights into the page cache before the restart
    prewarm_margin_gib: float = 8.0  # host memory that pre-warming leaves free
    metrics_file: str | None = None  # the node_exporter textfile written after each run; None: none
    drain: bool = True  # wait for the running server's requests before a restart
    drain_timeout_s: float = 900.0  # the longest deployctl waits for them ([drain] timeout_s)
    drain_stop_allowance_s: float = 120.0  # SGLang's own shutdown after its drain ([drain] stop_allowance_s)
    # [router]: the model gateway this server sits behind, and the URL it knows the server by
    router_url: str | None = None
    router_worker_url: str | None = None
    router_timeout_s: float = 60.0
    # [pd]: the unit's role as the router (sglang-router in PD mode) registers it again after its restart
    router_worker_type: str | None = None  # "prefill" or "decode"
    router_bootstrap_port: int | None = None  # a prefill's --disaggregation-bootstrap-port
    # apply, [pd]: the running server switches to this role (POST /pd_role_switch) instead of a restart;
    # the router fields then name its old role, and it goes back in with the installed unit's
    pd_switch_role: str | None = None
    pd_switch_graph_url: str | None = None  # ... to decode: the decode peer whose graph memory SGLang needs
    pd_router_keeps: bool = (
        False  # apply, a [pd] router: its unit changes by switched roles alone: no restart
    )
    group: Group | None = None  # apply: this node's rank in a multi-node service
    kind: str = ENGINE_KIND  # apply: an SGLang server, or a [pd] service's router
    routed_url: str | None = None  # apply, [pd]: once ready, one completion through this router must answer
    start: bool = False  # apply --start: an unchanged unit someone stopped is started (else left stopped)
    # recover: the transaction whose runner died, run by the follower its coordinator still reads (a group
    # node then waits for that coordinator's "go-back"; a later run's recovery does not)
    died: str | None = None
    signal: str | None = None  # signal: "go", "commit" or "abort" to transaction `txn`
    reason: str = ""  # signal abort: why, for the node's report
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Request:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"request is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ProtocolError("request must be a JSON object")
        if raw.get("version") != VERSION:
            raise ProtocolError(f"protocol version {raw.get('version')!r} is not {VERSION}: update the agent")
        try:
            smoke = Smoke(**raw.pop("smoke", {}))
            timeouts = Timeouts(**raw.pop("timeouts", {}))
            raw["secret_names"] = tuple(raw.get("secret_names", ()))
            raw["keep_secret_env"] = tuple(raw.get("keep_secret_env", ()))
            group = raw.pop("group", None)
            raw["group"] = Group(**group) if isinstance(group, dict) else group
            req = cls(smoke=smoke, timeouts=timeouts, **raw)
        except TypeError as exc:
            raise ProtocolError(f"bad request: {exc}") from None
        req.validate()
        return req

    def validate(self) -> None:
        """Refuse anything that could write outside the unit directory or smuggle a newline."""
        self._check_types()
        _check(self.verb in VERBS, f"unknown verb {self.verb!r}")
        _check(bool(UNIT_NAME.fullmatch(self.unit)) and ".." not in self.unit, f"bad unit name {self.unit!r}")
        for name in ("unit_dir", "state_dir", "secrets_dir"):
            path = getattr(self, name)
            ok = isinstance(path, str) and path.startswith("/") and "/../" not in path + "/"
            _check(ok and not find_control(path), f"{name} must be an absolute path")
        _check(0 <= self.margin < 0.5, "margin must be in [0, 0.5)")
        _check(1 <= self.port <= 65535, "port out of range")
        _check(1 <= self.keep_backups <= 1000, "keep_backups out of range")
        _check(re.fullmatch(r"[A-Za-z0-9.:\[\]-]{1,255}", self.http_host) is not None, "bad http_host")
        for value in (self.target_context, self.planned_pool, self.planned_host_pool):
            _check(value is None or (isinstance(value, int) and value > 0), "token counts must be positive")
        if self.verb in ("apply", "compare"):
            _check(isinstance(self.unit_text, str) and self.target_context is not None, "apply needs a unit")
        if self.unit_text is not None:  # apply's unit, or the one a [pd] unit's facts are read for
            _check(isinstance(self.unit_text, str), "unit text must be text")
            _check(not find_control(self.unit_text, "\t\n"), "unit text contains a control character")
            _check(not SURROGATE.search(self.unit_text), "unit text is not valid UTF-8 (a lone surrogate)")
            _check("ExecStart=" in self.unit_text, "unit text has no ExecStart=")
        if self.daemon_text is not None:
            _check(
                not find_control(self.daemon_text, "\t\n"), "daemon unit text contains a control character"
            )
            _check(not SURROGATE.search(self.daemon_text), "daemon unit text is not valid UTF-8")
            _check("ExecStart=" in self.daemon_text, "daemon unit text has no ExecStart=")
        if self.backup is not None:
            m = BACKUP_NAME.fullmatch(self.backup)
            _check(m is not None and m["unit"] == self.unit, f"bad backup name {self.backup!r}")
        if self.expect_sha256 is not None:
            _check(re.fullmatch(r"[0-9a-f]{64}|absent", self.expect_sha256) is not None, "bad expect_sha256")
        if self.txn is not None:
            _check(TXN_ID.fullmatch(self.txn) is not None, f"bad transaction id {self.txn!r}")
        _check(self.smoke.prompt_tokens > 0 and self.smoke.timeout_s > 0, "bad smoke test settings")
        self._check_group()
        for text in (self.smoke.sentence, self.smoke.question, self.smoke.expect, *self.secret_names):
            _check(not find_control(text), "smoke test text contains a control character")

    def _check_group(self) -> None:
        g = self.group
        if g is not None:
            _check(_is_int(g.rank) and _is_int(g.nnodes) and 0 <= g.rank < g.nnodes <= 64, "bad group rank")
            _check(_is_number(g.wait_s) and 0 < g.wait_s <= 7 * 86400, "bad group wait_s")
            _check(isinstance(g.collective, bool), "bad group collective")
            _check(self.verb in ("apply", "rollback"), "only apply and rollback run as a node of a group")
        if self.verb == "signal":
            _check(
                self.signal in SIGNALS and self.txn is not None,
                "signal needs one of go/go-back/commit/abort and txn",
            )
        _check(isinstance(self.reason, str) and not find_control(self.reason), "bad reason")

    def _check_types(self) -> None:
        """JSON may put any type anywhere: refuse what the range checks could not even compare."""
        for name in ("verb", "unit", "unit_dir", "state_dir", "http_host"):
            _check(isinstance(getattr(self, name), str), f"{name} must be text")
        for name in ("unit_text", "daemon_text", "backup", "expect_sha256", "txn", "died"):
            value = getattr(self, name)
            _check(value is None or isinstance(value, str), f"{name} must be text")
        counts = ("target_context", "planned_pool", "planned_host_pool")  # token counts: None or an int
        for value in (self.host_budget_pinned, self.host_budget_capacity):  # bytes: None or an int >= 0
            _check(value is None or (_is_int(value) and value >= 0), "host budget bytes must be integers")
        for name in ("port", "keep_backups", "version", *counts):
            value = getattr(self, name)
            _check((name in counts and value is None) or _is_int(value), f"{name} must be an integer")
        _check(_is_number(self.margin), "margin must be a number")
        _check(isinstance(self.detach, bool), "detach must be true or false")
        _check(isinstance(self.prewarm, bool), "prewarm must be true or false")
        _check(isinstance(self.pool_calibrated, bool), "pool_calibrated must be true or false")
        _check(isinstance(self.drain, bool), "drain must be true or false")
        for value in (self.drain_timeout_s, self.drain_stop_allowance_s):
            _check(_is_number(value) and 0 <= value <= 86400, "drain seconds must be in [0, 86400]")
        _check(_is_number(self.prewarm_margin_gib) and self.prewarm_margin_gib >= 0, "bad prewarm margin")
        _check(all(isinstance(name, str) for name in self.secret_names), "secret_names must be text")
        kept = self.keep_secret_env
        _check(
            all(isinstance(n, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in kept),
            "bad keep_secret_env",
        )
        _check(isinstance(self.host_name, str) and not find_control(self.host_name), "bad host_name")
        _check(self.kind in KINDS, f"kind must be one of {', '.join(KINDS)}")
        self._check_router()
        _check(_is_number(self.router_timeout_s) and 0 < self.router_timeout_s <= 3600, "bad router timeout")
        if self.metrics_file is not None:
            ok = isinstance(self.metrics_file, str) and "/../" not in self.metrics_file
            ok = ok and re.fullmatch(r"/[A-Za-z0-9_./@+-]*\.prom", self.metrics_file) is not None
            _check(ok, "metrics_file must be an absolute path ending in .prom")
        self._check_nested_types()

    def _check_router(self) -> None:
        """The router's URLs, and a [pd] unit's role and bootstrap port in it."""
        for url in (self.router_url, self.router_worker_url, self.routed_url):
            _check(
                url is None or (isinstance(url, str) and HTTP_URL.fullmatch(url) is not None),
                "bad router URL",
            )
        _check((self.router_url is None) == (self.router_worker_url is None), "router needs both URLs")
        _check(self.router_worker_type in (None, "prefill", "decode"), "bad router worker type")
        port = self.router_bootstrap_port
        _check(port is None or (_is_int(port) and 0 < port < 65536), "bad router bootstrap port")
        _check(self.pd_switch_role in (None, "prefill", "decode"), "bad role to switch to")
        graph = self.pd_switch_graph_url
        _check(graph is None or (isinstance(graph, str) and HTTP_URL.fullmatch(graph) is not None), "bad URL")
        _check(self.pd_switch_role is None or self.verb == "apply", "only apply switches a role")
        _check(isinstance(self.pd_router_keeps, bool), "pd_router_keeps must be true or false")

    def _check_nested_types(self) -> None:
        """The secrets' names and values, the smoke test's settings and the timeouts."""
        for label, secrets in (("secret_env", self.secret_env), ("secret_flags", self.secret_flags)):
            _check(isinstance(secrets, dict), f"{label} must be an object")
            for key, value in secrets.items():
                named = isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_-]+", key) is not None
                _check(
                    named and isinstance(value, str),
                    f"{label}: names are letters, digits, _ and -; values are text",
                )
                _check(not find_control(value) and not SURROGATE.search(value), f"{label}: bad value")
        s = self.smoke
        texts = (s.sentence, s.question, s.expect)
        ok = isinstance(s.enabled, bool) and _is_int(s.prompt_tokens) and _is_number(s.timeout_s)
        ok = ok and _is_int(s.load) and 0 <= s.load <= 256
        _check(ok and all(isinstance(t, str) for t in texts), "bad smoke test settings")
        limits = asdict(self.timeouts).values()
        _check(all(_is_number(v) and v > 0 for v in limits), "timeouts must be positive numbers of seconds")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ProtocolError(message)


# SGLang's own shutdown once its drain is done: the drain loop checks every 5 s, schedulers get 15 s to
# release (tokenizer_manager.py _SCHEDULER_EXIT_TIMEOUT_SECS), kill_process_tree waits up to 60 s, and
# the GPU driver then frees the memory. systemd's SIGKILL must not land inside that.
STOP_ALLOWANCE_S = 120


def stop_timeout_s(drain_timeout_s: float, allowance_s: float = STOP_ALLOWANCE_S) -> int:
    """The unit's TimeoutStopSec: SGLang's own drain gets the drain's time, then its shutdown its own."""
    return math.ceil(drain_timeout_s) + math.ceil(allowance_s)
