"""The host agent as one self-contained zipapp: the host-side package plus its pure-Python dependencies.

A zipapp needs nothing installed on the server but python3; pydantic (compiled) is not needed there,
which is why the host side speaks stdlib dataclasses (agent/protocol.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import zipfile
from functools import lru_cache
from pathlib import Path

# The agent's own modules that run on the host, and the libraries they import.
HOST_PARTS = ("__init__.py", "exitcodes.py", "protocol.py", "host", "sglang")
VENDORED = ("jeepney", "requests", "urllib3", "idna", "certifi", "tenacity")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same code gives the same checksum


# The bundle's entry point. Importing from a zip compiles every module on every run (zipimport never
# caches bytecode), which costs the host ~0.6 s per call; so the bundle unpacks itself once, next to
# itself (atomically: a half-unpacked folder is never used), and runs from there with cached bytecode.
BAD_BUNDLE = 97  # the exit status of a bundle whose bytes do not match the checksum it was called with
# `--sha256 HEX` first: the bundle checks its own bytes before anything runs (exit 97 on a mismatch), so
# deployctl needs no separate round trip to verify it on every call.
_MAIN = f"""\
import hashlib, os, runpy, sys, tempfile, zipfile
here = os.path.abspath(sys.argv[0])
if sys.argv[1:2] == ["--sha256"]:
    with open(here, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != sys.argv[2]:
            print("deployctl-agent: bundle checksum mismatch: " + here, file=sys.stderr)
            sys.exit({BAD_BUNDLE})
    del sys.argv[1:3]
unpacked = here + ".d"
if not os.path.isdir(unpacked):
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=os.path.dirname(here))
    with zipfile.ZipFile(here) as zf:
        zf.extractall(tmp)
    try:
        os.rename(tmp, unpacked)
    except OSError:  # another run unpacked it first
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
sys.path[0] = unpacked
runpy.run_module("agent.host", run_name="__main__")  # sys.argv[0] stays the bundle
"""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"cannot find the package {name} to bundle")
    return Path(next(iter(spec.submodule_search_locations)))


def _files(root: Path, prefix: str) -> list[tuple[str, Path]]:
    if root.is_file():
        return [(prefix, root)]
    return [
        (f"{prefix}/{p.relative_to(root).as_posix()}", p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".pem", ".typed")
    ]


def _entries() -> list[tuple[str, Path]]:
    agent_dir = _package_dir("agent")
    entries: list[tuple[str, Path]] = []
    for part in HOST_PARTS:
        entries += _files(agent_dir / part, f"agent/{part}")
    for name in VENDORED:
        entries += _files(_package_dir(name), name)
    return sorted(entries)


def _cache_path(entries: list[tuple[str, Path]]) -> Path:
    """Where a bundle of exactly these source files (by name, size and mtime) was kept by an earlier run."""
    key = hashlib.sha256(_MAIN.encode())
    for arcname, path in entries:
        st = path.stat()
        key.update(f"{arcname}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deployctl"
    return base / f"bundle-{key.hexdigest()[:24]}.pyz"


@lru_cache(maxsize=1)
def build() -> tuple[bytes, str]:
    """The bundle's bytes and its sha256 (deterministic for the same sources; cached between runs)."""
    entries = _entries()
    cached = _cache_path(entries)
    with contextlib.suppress(OSError):
        data = cached.read_bytes()
        return data, hashlib.sha256(data).hexdigest()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN.encode())
        for arcname, path in entries:
            info = zipfile.ZipInfo(arcname, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    data = buf.getvalue()
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(cached)
    return data, hashlib.sha256(data).hexdigest()


def remote_name(sha: str) -> str:
    return f"agent-{sha[:16]}.pyz"
