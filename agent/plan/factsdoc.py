"""The facts document `deployctl facts` prints (deployctl-facts/1), filled from the inventory where the host
did not say, and its text: for one host's service, and for each prefill and decode of a [pd] service (with
the transfer facts its agent read: host/roles/pdfacts.py)."""

from __future__ import annotations

from typing import cast

from agent.inventory import HostConfig
from agent.protocol.answers import FactsDoc, GpuCard, ModelFact, PdFactsData


def filled(doc: FactsDoc, host: HostConfig) -> FactsDoc:
    """The agent's model facts, with the inventory's SGLang release, draft and cards where it gave none."""
    if not (doc.get("sglang") or {}).get("version"):  # no SGLang in the unit's Python to ask
        doc["sglang"] = {"version": host.sglang.version, "source": "inventory"}
    if doc.get("draft") is None:  # no draft config.json on the host: the inventory's figures
        from agent.plan.from_inventory import inventory_draft

        tp = int(str((doc.get("flags") or {}).get("tp-size") or host.gpus.count))
        doc["draft"] = cast("ModelFact | None", inventory_draft(host, tp))
    if not doc.get("gpus"):  # no nvidia-smi answer: the inventory's cards, marked as such
        card = {"name": host.gpus.name, "memory_total_mib": round(host.gpus.memory_gib * 1024, 1),
                "source": "inventory"}  # fmt: skip
        doc["gpus"] = [cast(GpuCard, card)] * host.gpus.count
    else:  # the facts of this service: its own GPUs, so that `plan --facts` plans on them
        from agent.plan.facts import service_gpus

        doc["gpus"] = cast("list[GpuCard]", service_gpus(doc["gpus"], host))
    return doc


def facts_lines(name: str, doc: FactsDoc) -> list[str]:
    """What `deployctl facts` prints of one document."""
    model = doc["model"]
    arch = (cast("list[str]", model["config"].get("architectures")) or ["?"])[0]
    gpus = doc.get("gpus") or []
    weights = model.get("weights_bytes")
    lines = [
        f"facts for {name} ({doc['format']})",
        f"  gpus     {len(gpus)} x {gpus[0]['name'] if gpus else '?'}"
        + (f", {gpus[0]['memory_total_mib']:.0f} MiB" if gpus else ""),
        f"  sglang   {doc['sglang'].get('version')}",
        f"  model    {model.get('path')}: {arch}, weights "
        + (f"{weights / 2**30:.2f} GiB" if weights is not None else "unknown"),
    ]
    draft = doc.get("draft")
    if draft:
        lines.append(f"  draft    {draft.get('path')}")
    lines.append(
        f"  flags    {len(doc.get('flags') or {})}, last start: {'yes' if doc.get('last_start') else 'none'}"
    )
    return lines


def transfer_lines(pd: PdFactsData | None) -> list[str]:
    """A [pd] role's transfer facts: the backends installed for its Python, its engine's import, RDMA."""
    if pd is None:
        return ["  transfer not read (no installed prefill or decode unit)"]
    found = pd.get("importable")
    rdma = pd.get("rdma_devices")
    lines = [
        "  transfer installed: "
        + ("unknown (the unit's Python is not known)" if found is None else ", ".join(found) or "none"),
        "  rdma     "
        + ("unreadable" if rdma is None else ", ".join(rdma) or "none (no /sys/class/infiniband)"),
    ]
    engine = pd.get("engine")
    if engine:
        verdict = {"importable": "imports", "not_importable": "installed but not importable"}.get(
            engine["verdict"], "not checked"
        )
        lines.append(f"  engine   {engine['backend']}: {verdict}: {engine['detail']}")
    return lines
