"""`deployctl status` of a [pd] service: each role's units and the router, each asked as its own unit (its
state, its last transaction and the pool its last start logged), and a word when a role is down while the
router runs (the router keeps routing to what is left: a prefill or decode gone fails every request)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from agent.exitcodes import ExitCode
from agent.group.status import running, statuses
from agent.inventory import HostConfig
from agent.orchestrate.asked import Connection
from agent.orchestrate.session import status_text
from agent.output import Output, Style
from agent.protocol.answers import StatusAnswer


def parts(host: HostConfig) -> list[tuple[str, HostConfig]]:
    """(label, the unit as a service of its own): prefills, decodes, then the router."""
    from agent.group.pdapply import router_host
    from agent.pd.units import pd_units

    return [(u.label, u.host) for u in pd_units(host)] + [("router", router_host(host))]


def pool_of(answer: StatusAnswer) -> int | None:
    """The KV pool the last transaction's start logged, where it said one."""
    last = answer.get("last_outcome")
    pool = last["data"].get("kv_tokens") if last else None
    return pool if isinstance(pool, int) and not isinstance(pool, bool) else None


def line(label: str, unit: HostConfig, answer: StatusAnswer) -> str:
    text = status_text(unit.ssh.target, unit.unit.name, answer)
    pool = pool_of(answer)
    first, _, rest = text.partition("\n")
    first += f", KV pool {pool:,} tokens (its last start)" if pool is not None else ""
    return f"{label:<11} {first}" + (f"\n{rest}" if rest else "")


def warning(labels: Sequence[str], answers: Sequence[StatusAnswer]) -> str | None:
    down = [label for label, a in zip(labels, answers, strict=True) if not running(a.get("state"))]
    if not down:
        return None
    return (f"{', '.join(down)} not running: the service serves no request that needs "
            f"{'them' if len(down) > 1 else 'it'}; start it, or apply the service again")  # fmt: skip


def status(host: HostConfig, conn: Connection, out: Output) -> int:
    units = parts(host)
    answers = statuses([u for _, u in units], conn, out)
    labels = [label for label, _ in units]
    said = warning(labels, answers)
    if out.style is Style.JSON:
        doc = [
            {
                "label": label,
                "target": u.ssh.target,
                "unit": u.unit.name,
                "pool_tokens": pool_of(a),
                "status": a,
            }
            for (label, u), a in zip(units, answers, strict=True)
        ]
        out.print(
            json.dumps({"service": host.name, "units": doc, "warning": said}, sort_keys=True, default=str)
        )
        return int(ExitCode.OK)
    for (label, unit), answer in zip(units, answers, strict=True):
        out.print(line(label, unit, answer))
    if said:
        out.print(f"WARNING: {said}")
    return int(ExitCode.OK)
