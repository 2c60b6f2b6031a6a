"""A transaction's folder (<state>/txn/<id>/): its request, never a secret value in it, and its retention.

request.json names the secret values it carries by reference only (a digest salted with the transaction's
id). The detached runner needs the values themselves: they wait in a root-only file under the agent's
state folder (`staged/`, 0700, outside every transaction's folder), which the runner reads and removes as
it starts; the secrets folder itself is written only by the transaction, after its backup. Folders are kept
with the backups' retention: the unit's newest `keep_backups` finished transactions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path

from agent.host.change.record import CorruptRecord
from agent.host.state import StateDir, write_json_atomic
from agent.protocol.common import TXN_ID
from agent.protocol.grouprecord import GROUP_RECORD, GroupRecord
from agent.protocol.requests import Request

REQUEST = "request.json"
STAGED = "staged"


class StagedSecretsError(Exception):
    """The secret values staged for a transaction are missing or are not the ones its request names."""


def references(txn: str, values: Mapping[str, str]) -> dict[str, str]:
    """Each value -> a digest that names it without giving it away (salted: equal values in two
    transactions give different digests)."""
    return {
        name: "sha256:" + hashlib.sha256(f"{txn}\n{name}\n{value}".encode()).hexdigest()
        for name, value in values.items()
    }


def staged_path(req: Request, txn: str) -> Path:
    return StateDir(req.state_dir).root / STAGED / f"{txn}.json"


def write_request(state_dir: StateDir, req: Request, txn: str) -> None:
    """request.json of the transaction, secret values replaced by their references; a group node's group
    record before it (protocol/grouprecord.py)."""
    named = dataclasses.replace(
        req, secret_env=references(txn, req.secret_env), secret_flags=references(txn, req.secret_flags)
    )
    group = GroupRecord.of(req)
    if group is not None:  # first: a folder whose request is there has its group record
        write_json_atomic(state_dir.txn_dir(txn) / GROUP_RECORD, json.loads(group.to_json()))
    write_json_atomic(state_dir.txn_dir(txn) / REQUEST, json.loads(named.to_json()))


def stage_secrets(req: Request, txn: str) -> None:
    """The secret values for the detached runner: root-only, in the secrets folder, never in the txn's."""
    if req.secret_env or req.secret_flags:
        staged = {"secret_env": req.secret_env, "secret_flags": req.secret_flags}
        write_json_atomic(staged_path(req, txn), staged)


def drop_staged(req: Request, txn: str) -> None:
    """Remove the values staged for a transaction whose runner is gone without taking them."""
    with contextlib.suppress(OSError):
        staged_path(req, txn).unlink(missing_ok=True)


def load_request(state_dir: StateDir, txn: str) -> Request:
    """The transaction's request with its secret values back, taken from the staged file (then removed)."""
    req = Request.from_json((state_dir.txn_dir(txn) / REQUEST).read_text(encoding="utf-8"))
    if not (req.secret_env or req.secret_flags):
        return req
    path = staged_path(req, txn)
    try:
        staged = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StagedSecretsError(f"the secret values staged for {txn} cannot be read ({exc})") from None
    finally:
        path.unlink(missing_ok=True)
    env, flags = staged.get("secret_env"), staged.get("secret_flags")
    same = isinstance(env, dict) and isinstance(flags, dict)
    if not (same and references(txn, env) == req.secret_env and references(txn, flags) == req.secret_flags):
        raise StagedSecretsError(f"the secret values staged for {txn} are not the ones its request names")
    return dataclasses.replace(req, secret_env=env, secret_flags=flags)


def prune(req: Request, keep: int, protect: Collection[str] = ()) -> list[str]:
    """Remove the unit's transaction folders beyond its newest `keep` finished ones; the removed ids.

    Stays: a transaction without an outcome (running, or waiting for recovery), the unit's last one, the
    one its recovery record names, those in `protect`, and every other unit's. An unreadable record
    prunes nothing: a person must look first.
    """
    state_dir, unit = StateDir(req.state_dir), req.unit
    _drop_stale_staged(state_dir)
    try:
        record = state_dir.load_record(unit)
    except CorruptRecord:
        return []
    protected = {*protect, state_dir.last_txn(unit), record.txn if record else None}
    root = state_dir.root / "txn"
    names = [p.name for p in root.iterdir()] if root.is_dir() else []
    ids = sorted((name for name in names if TXN_ID.fullmatch(name)), reverse=True)
    finished = [t for t in ids if _unit_of(state_dir, t) == unit and state_dir.has_outcome(t)]
    removed = [t for t in finished[keep:] if t not in protected]
    for txn in removed:
        shutil.rmtree(state_dir.txn_dir(txn), ignore_errors=True)
    return removed


def _drop_stale_staged(state_dir: StateDir) -> None:
    """Staged values whose runner never took them (it died first): its transaction ended, or is gone."""
    for path in (state_dir.root / STAGED).glob("*.json"):
        txn = path.name.removesuffix(".json")
        if state_dir.has_outcome(txn) or not state_dir.txn_dir(txn).is_dir():
            path.unlink(missing_ok=True)


def _unit_of(state_dir: StateDir, txn: str) -> str | None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        unit = json.loads((state_dir.txn_dir(txn) / REQUEST).read_text(encoding="utf-8")).get("unit")
        return unit if isinstance(unit, str) else None
    return None
