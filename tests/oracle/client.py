"""Ask SGLang 0.5.23's own sizing code (run by _worker.py in the oracle venv) for KV pools, with a disk cache.

Standard library only: the simulated SGLang server imports this file inside the test host, where neither the
project nor its packages are installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
SCHEMA = 1  # raise when a request or an answer changes shape: old cache entries stop matching
HERE = Path(__file__).resolve().parent
HOME_CACHE = Path(os.environ.get("HOME", "/root")) / ".cache/deployctl"
# Answers for the starts the test suite makes, kept in the repository (read-only, checked after the writable
# cache) so a fresh machine's first sim starts do not each wait for SGLang to import.
SHIPPED_CACHE = HERE / "cache"
# Where a test host binds the venv and the writable cache (tests/testhost/instance.py).
HOST_VENV, HOST_CACHE = Path("/opt/deployctl-oracle-venv"), Path("/opt/deployctl-oracle-cache")


def venv_dir() -> Path:
    if os.environ.get("DEPLOYCTL_ORACLE_VENV"):
        return Path(os.environ["DEPLOYCTL_ORACLE_VENV"])
    return HOST_VENV if HOST_VENV.is_dir() else HOME_CACHE / f"oracle-sglang-{SGLANG_VERSION}"


def cache_dir() -> Path:
    if os.environ.get("DEPLOYCTL_ORACLE_CACHE"):
        return Path(os.environ["DEPLOYCTL_ORACLE_CACHE"])
    return HOST_CACHE if HOST_CACHE.is_dir() else HOME_CACHE / f"oracle-cache-{SGLANG_VERSION}"


def site_packages(venv: Path) -> Path:
    return venv / "lib/python3.11/site-packages"


def venv_ready(venv: Path | None = None) -> bool:
    venv = venv or venv_dir()
    return (venv / ".oracle-stamp").is_file() and (site_packages(venv) / "sglang").is_dir()


def key(request: dict[str, Any]) -> str:
    """Everything that can change the answer: config, draft, flags, env, GPU figures, version."""
    extra = {"model_stand_in": 2} if _built_model_matters(request) else {}
    canonical = json.dumps({"v": SGLANG_VERSION, "schema": SCHEMA, **extra, **request}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _built_model_matters(request: dict[str, Any]) -> bool:
    """A PP start, or a checkpoint whose quant config names a KV scheme: answered with the worker's model
    stand-in since it was added, so answers kept from before stop matching (every other key is unchanged)."""
    flags = request.get("flags") or []
    pp = any(f in ("--pp-size", "--pp", "--pipeline-parallel-size") for f in flags)
    config = request.get("config") or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quants = [c.get("quantization_config") for c in (config, text or {})]
    kv = any(
        isinstance(q, dict) and (q.get("kv_cache_scheme") or q.get("kv_cache_quant_algo")) for q in quants
    )
    return pp or kv


def cached(request: dict[str, Any]) -> dict[str, Any] | None:
    name = key(request) + ".json"
    for folder in (cache_dir(), SHIPPED_CACHE):
        try:
            answer: dict[str, Any] = json.loads((folder / name).read_text())["answer"]
        except (OSError, ValueError, KeyError):
            continue
        if folder != SHIPPED_CACHE:
            with contextlib.suppress(OSError):
                os.utime(folder / name)  # last use, so the entries a test run needs can be told apart
        return answer
    return None


def _summary(request: dict[str, Any]) -> dict[str, Any]:
    """The request as stored beside its answer: configs by their hash, to keep entries small."""
    out = dict(request)
    for name in ("config", "draft_config"):
        if out.get(name) is not None:
            text = json.dumps(out[name], sort_keys=True).encode()
            out[name] = {
                "sha256": hashlib.sha256(text).hexdigest(),
                "model_type": request[name].get("model_type"),
            }
    return out


def store(request: dict[str, Any], answer: dict[str, Any], folder: Path | None = None) -> None:
    folder = folder or cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"request": _summary(request), "answer": answer}, sort_keys=True, indent=1)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "w") as out:
            out.write(body)
        os.replace(tmp, folder / (key(request) + ".json"))
    except OSError:
        pass  # a read-only cache still answers; the next run asks SGLang again


def _command(venv: Path) -> list[str]:
    """The venv's own python where it runs; elsewhere (a test host) any CPython 3.11 on its site-packages."""
    worker = str(HERE / "_worker.py")
    python = venv / "bin/python"
    if python.exists() and os.access(python.resolve(), os.X_OK):
        return [str(python), worker]
    if sys.version_info[:2] != (3, 11):
        raise OracleUnavailable(f"the oracle needs CPython 3.11 (its wheels are cp311), not {sys.version}")
    return [sys.executable, "-s", worker, "--site", str(site_packages(venv))]


class OracleUnavailable(RuntimeError):
    """No oracle venv here (build it with `make oracle`)."""


def _group(requests: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Requests by GPU kind: one worker process per kind (SGLang caches device facts at import)."""
    groups: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
        gpu = req["gpu"]
        kind = json.dumps([gpu["count"], gpu["total_gib"], gpu["capability"], gpu["name"]])
        groups.setdefault(kind, []).append(i)
    return groups


def ask(requests: Iterable[dict[str, Any]], timeout: float = 900.0) -> list[dict[str, Any]]:
    """Answers in order: from the cache where known, else from one SGLang run per GPU kind."""
    requests = list(requests)
    answers: list[dict[str, Any] | None] = [cached(r) for r in requests]
    missing = [i for i, a in enumerate(answers) if a is None]
    if missing:
        venv = venv_dir()
        if not venv_ready(venv):
            raise OracleUnavailable(f"no oracle venv at {venv} (run `make oracle`)")
        todo = [requests[i] for i in missing]
        for indices in _group(todo).values():
            batch = [todo[i] for i in indices]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
            env |= {"PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            store_at = [str(cache_dir() / (key(r) + ".json")) for r in batch]
            payload = json.dumps({"requests": batch, "store": store_at})
            proc = subprocess.run(
                _command(venv),
                input=payload,
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"oracle worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            results = json.loads(proc.stdout)["results"]
            for i, answer in zip(indices, results, strict=True):
                answers[missing[i]] = answer
                store(todo[i], answer)
    return [a for a in answers if a is not None]
