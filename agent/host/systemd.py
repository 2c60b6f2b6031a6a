"""systemd's D-Bus API over jeepney: reload, start/stop/restart with the job's result, unit state."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jeepney import DBusAddress, MatchRule, Properties, message_bus, new_method_call
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.io.common import FilterHandle
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
UNIT_IFACE = "org.freedesktop.systemd1.Unit"
SERVICE_IFACE = "org.freedesktop.systemd1.Service"
MANAGER = DBusAddress(MANAGER_PATH, bus_name=SYSTEMD, interface=MANAGER_IFACE)
CALL_TIMEOUT_S = 30.0


class SystemdError(Exception):
    """A call to systemd failed; the message says which call and why."""


class JobWaitTimeout(SystemdError):
    """systemd did not finish a job within the time we were willing to wait."""


@dataclass(frozen=True)
class JobResult:
    """How a queued job ended: result is systemd's word ("done", "failed", "canceled", "timeout", ...)."""

    unit: str
    job: str
    result: str

    @property
    def ok(self) -> bool:
        return self.result == "done"


@dataclass(frozen=True)
class UnitState:
    """A snapshot of one unit's state as systemd reports it."""

    unit: str
    load_state: str
    active_state: str
    sub_state: str
    invocation_id: str  # hex; "" when the unit has never started
    need_daemon_reload: bool
    n_restarts: int
    exec_main_status: int
    exec_main_code: int
    fragment_path: str
    active_enter_timestamp_us: int
    drop_in_paths: tuple[str, ...] = ()


class Systemd:
    """One connection to the system bus, talking to systemd's manager."""

    def __init__(self, bus: str = "SYSTEM", timeout: float = CALL_TIMEOUT_S) -> None:
        self._timeout = timeout
        try:
            self._conn: DBusConnection = open_dbus_connection(bus=bus)
        except (OSError, ValueError, KeyError) as exc:
            raise SystemdError(f"cannot connect to the system bus ({bus}): {exc}") from exc
        self._jobs_rule = MatchRule(
            type="signal", interface=MANAGER_IFACE, member="JobRemoved", path=MANAGER_PATH
        )
        self._watched: dict[str, FilterHandle] = {}  # unit object path -> its signals
        # The bus only forwards signals we asked for; ask before any job exists so none is missed.
        self._call(message_bus.AddMatch(self._jobs_rule), "AddMatch")
        self._manager("Subscribe")

    def close(self) -> None:
        """Drop the bus connection."""
        for handle in self._watched.values():
            handle.close()
        self._conn.close()

    def __enter__(self) -> Systemd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def daemon_reload(self, timeout: float = 90.0) -> None:
        """Reload all unit files; returns once systemd has finished (its reply comes after the reload)."""
        self._manager("Reload", timeout=timeout)

    def restart(self, unit: str, timeout: float) -> JobResult:
        """Restart the unit and wait for the job to finish."""
        return self._run_job("RestartUnit", unit, timeout)

    def start(self, unit: str, timeout: float) -> JobResult:
        """Start the unit and wait for the job to finish."""
        return self._run_job("StartUnit", unit, timeout)

    def stop(self, unit: str, timeout: float) -> JobResult:
        """Stop the unit and wait for the job to finish."""
        return self._run_job("StopUnit", unit, timeout)

    def leftovers(self, unit: str) -> list[int]:
        """The processes still in the unit's control group (a stopped unit should have none)."""
        path = self.unit_path(unit)
        group = str(self._get_all(path, SERVICE_IFACE).get("ControlGroup") or f"/system.slice/{unit}")
        try:
            text = Path(f"/sys/fs/cgroup{group}/cgroup.procs").read_text(encoding="ascii")
        except OSError:  # no such group: nothing left
            return []
        return [int(word) for word in text.split()]

    def kill(self, unit: str, signal: int) -> None:
        """Send `signal` to every process of the unit (systemd's KillUnit, whom "all")."""
        self._manager("KillUnit", "ssi", (unit, "all", signal))

    def reset_failed(self, unit: str) -> None:
        """Forget the unit's failed state and its start-limit counter."""
        try:
            self._manager("ResetFailedUnit", "s", (unit,))
        except SystemdError as exc:
            # A unit that is stopped and unloaded has nothing to reset; systemd calls that NoSuchUnit.
            if f"{SYSTEMD}.NoSuchUnit" not in str(exc):
                raise

    def unit_path(self, unit: str) -> str:
        """The unit's object path, loading the unit if systemd has not yet."""
        (path,) = self._manager("LoadUnit", "s", (unit,))
        return str(path)

    def unit_state(self, unit: str) -> UnitState:
        """Read the unit's state in two calls (unit and service properties)."""
        path = self.unit_path(unit)
        props = self._get_all(path, UNIT_IFACE)
        service = self._get_all(path, SERVICE_IFACE) if unit.endswith(".service") else {}
        return UnitState(
            unit=unit,
            load_state=str(props["LoadState"]),
            active_state=str(props["ActiveState"]),
            sub_state=str(props["SubState"]),
            invocation_id=bytes(props.get("InvocationID", b"")).hex(),
            need_daemon_reload=bool(props["NeedDaemonReload"]),
            n_restarts=int(service.get("NRestarts", 0)),
            exec_main_status=int(service.get("ExecMainStatus", 0)),
            exec_main_code=int(service.get("ExecMainCode", 0)),
            fragment_path=str(props.get("FragmentPath", "")),
            active_enter_timestamp_us=int(props.get("ActiveEnterTimestamp", 0)),
            drop_in_paths=tuple(str(p) for p in props.get("DropInPaths", ())),
        )

    def exec_commands(self, unit: str, prop: str = "ExecStart") -> list[tuple[str, tuple[str, ...]]]:
        """systemd's own parse of a unit's ExecStart= (or ExecStartPre=...): (path, argv) per command,
        specifiers expanded, quotes and escapes removed; `$VAR` and `$$` are left for exec time."""
        return [(str(cmd[0]), tuple(str(w) for w in cmd[1])) for cmd in self.service_property(unit, prop)]

    def service_property(self, unit: str, prop: str) -> Any:
        """One property of a service unit, as systemd holds it (Environment: a list of NAME=value)."""
        address = DBusAddress(self.unit_path(unit), bus_name=SYSTEMD, interface=SERVICE_IFACE)
        ((_sig, value),) = self._call(Properties(address).get(prop), f"Get {prop} {unit}")
        return value

    def wait_for_change(self, unit: str, timeout: float) -> bool:
        """Block until the unit's properties change or timeout passes; True if they (may have) changed.

        The first call for a unit subscribes and returns True at once: a change between the caller's
        last read and the subscription would otherwise be lost, so the caller must look again.
        """
        path = self.unit_path(unit)
        handle = self._watched.get(path)
        if handle is None:
            rule = MatchRule(
                type="signal",
                interface="org.freedesktop.DBus.Properties",
                member="PropertiesChanged",
                path=path,
            )
            self._call(message_bus.AddMatch(rule), "AddMatch")
            self._watched[path] = self._conn.filter(rule, bufsize=64)
            return True
        queue: deque[Any] = handle.queue
        try:
            self._conn.recv_until_filtered(queue, timeout=max(timeout, 0.0))
        except TimeoutError:
            return False
        queue.clear()  # one wake-up per batch: the caller re-reads the state anyway
        return True

    def _run_job(self, method: str, unit: str, timeout: float) -> JobResult:
        deadline = time.monotonic() + timeout
        # The filter must exist before the call: JobRemoved can arrive before the call's reply.
        with self._conn.filter(self._jobs_rule, bufsize=1024) as removed:
            (job,) = self._manager(method, "ss", (unit, "replace"))
            while True:
                remaining = deadline - time.monotonic()
                try:
                    signal = self._conn.recv_until_filtered(removed, timeout=max(remaining, 0.0))
                except TimeoutError:
                    raise JobWaitTimeout(
                        f"{method} {unit}: job {job} not finished after {timeout:g} s"
                    ) from None
                _id, path, _unit, result = signal.body
                if path == job:
                    return JobResult(unit=unit, job=str(job), result=str(result))

    def _get_all(self, path: str, interface: str) -> dict[str, Any]:
        address = DBusAddress(path, bus_name=SYSTEMD, interface=interface)
        (props,) = self._call(Properties(address).get_all(), f"GetAll {interface} {path}")
        # jeepney gives each variant as (signature, value).
        return {name: value for name, (_sig, value) in props.items()}

    def _manager(
        self,
        method: str,
        signature: str | None = None,
        body: tuple[Any, ...] = (),
        timeout: float | None = None,
    ) -> tuple[Any, ...]:
        message = new_method_call(MANAGER, method, signature, body)
        label = f"{method} {' '.join(map(str, body))}".strip()
        return self._call(message, label, timeout)

    def _call(self, message: Any, label: str, timeout: float | None = None) -> tuple[Any, ...]:
        try:
            reply = self._conn.send_and_get_reply(message, timeout=timeout or self._timeout)
            return tuple(unwrap_msg(reply))
        except DBusErrorResponse as exc:
            detail = exc.data[0] if exc.data else ""
            raise SystemdError(f"{label}: {exc.name}: {detail}") from None
        except TimeoutError:
            raise SystemdError(
                f"{label}: no reply from systemd within {timeout or self._timeout:g} s"
            ) from None
        except OSError as exc:
            raise SystemdError(f"{label}: system bus connection failed: {exc}") from exc
