"""The host agent as one self-contained zipapp: the host-side package plus its pure-Python dependencies.

A zipapp needs nothing installed on the server but python3; pydantic (compiled) is not needed there,
which is why the host side speaks stdlib dataclasses (agent/protocol/).
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
HOST_PARTS = ("__init__.py", "exitcodes.py", "protocol", "host", "sglang")
VENDORED = ("jeepney", "requests", "urllib3", "idna", "certifi", "tenacity")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same code gives the same checksum


# The bundle's entry point. Importing from a zip compiles every module on every run (zipimport never
# caches bytecode), which costs the host ~0.6 s per call; so the bundle unpacks itself once, next to
# itself (atomically: a half-unpacked folder is never used), and runs from there with cached bytecode.
BAD_BUNDLE = 97  # the exit status of a bundle whose bytes do not match the checksum it was called with
# The file, written last into an unpacked folder, that names the bundle it came from: a folder without
# it (an unpack from before, or another bundle's) is unpacked afresh.
MARK = ".bundle-sha256"
STALE_UNPACK_S = 300  # an .unpack-* folder older than this was left by a killed run, not one in progress
# What every call imports before it does anything: a damaged folder fails here, while a second try is
# still safe (nothing done yet). agent.host.__main__ is what runpy then runs; verbs is what it imports.
PRELOAD = ("agent.host.__main__", "agent.host.verbs")
# `--sha256 HEX` first: the bundle checks its own bytes before anything runs (exit 97 on a mismatch), so
# deployctl needs no separate round trip to verify it on every call. Each call then checks the unpacked
# folder cheaply (its record, and every file at the size the zip gives it: one stat per file, about a
# millisecond, where hashing the folder would cost more than the unpack saves); a folder that fails, or
# that fails to import, is unpacked again once.
_MAIN = f"""\
import hashlib, importlib, io, os, runpy, shutil, sys, tempfile, time, zipfile
here = os.path.abspath(sys.argv[0])
with open(here, "rb") as f:
    data = f.read()
sha = hashlib.sha256(data).hexdigest()
if sys.argv[1:2] == ["--sha256"]:
    if sha != sys.argv[2]:
        print("deployctl-agent: bundle checksum mismatch: " + here, file=sys.stderr)
        sys.exit({BAD_BUNDLE})
    del sys.argv[1:3]
folder, unpacked = os.path.dirname(here), here + ".d"
mark = os.path.join(unpacked, "{MARK}")
shipped = zipfile.ZipFile(io.BytesIO(data))


def sound():
    try:
        with open(mark) as f:
            if f.read() != sha:
                return False
        return all(
            os.stat(os.path.join(unpacked, i.filename)).st_size == i.file_size for i in shipped.infolist()
        )
    except OSError:
        return False


def forget():
    # the folder is no good: its record goes, so this run and any other unpack it afresh
    try:
        os.unlink(mark)
    except OSError:
        pass


def sweep():
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            if name.startswith(".unpack-") and time.time() - os.lstat(path).st_mtime > {STALE_UNPACK_S}:
                shutil.rmtree(path)
        except OSError:
            pass


def unpack():
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=folder)
    shipped.extractall(tmp)
    with open(os.path.join(tmp, "{MARK}"), "w") as f:  # last: only a complete folder has it
        f.write(sha)
    old = None
    for attempt in range(3):
        try:
            os.rename(tmp, unpacked)  # atomic: a half-unpacked folder is never used
            break
        except OSError:  # a folder is in the way: a bad one, or another run's fresh one
            if sound():
                break
        old = old or tempfile.mkdtemp(prefix=".unpack-", dir=folder)
        try:
            os.rename(unpacked, os.path.join(old, str(attempt)))  # swapped: moved away, then removed
        except OSError:  # another run moved it first
            pass
    for path in (tmp, old):
        if path:
            shutil.rmtree(path, ignore_errors=True)


def unload():
    # modules imported from a bad folder must not outlive it
    inside = unpacked + os.sep
    for name, module in list(sys.modules.items()):
        paths = [getattr(module, "__file__", None) or ""] + list(getattr(module, "__path__", None) or [])
        if any(p.startswith(inside) for p in paths):
            del sys.modules[name]
    importlib.invalidate_caches()


def preload():
    for name in {PRELOAD!r}:
        importlib.import_module(name)
    sys.modules.pop("agent.host.__main__", None)  # runpy runs it afresh, as __main__


sweep()
if not sound():
    unpack()
sys.path[0] = unpacked
try:
    preload()
except Exception:  # a sound folder imports cleanly: some file in it is damaged, so unpack again, once
    unload()
    forget()
    unpack()
    importlib.invalidate_caches()
try:
    runpy.run_module("agent.host", run_name="__main__")  # sys.argv[0] stays the bundle
except (ImportError, SyntaxError):
    forget()  # damaged past what preload reaches: not retried (work may be half done), the next run mends it
    raise
"""


# The installer of the bundle, run as root through sudo (`python3 -I -c WRITER TARGET SHA256`, the bytes on
# stdin). It is not the bundle, which is what it installs, and it trusts no name another user could have
# made: a random name created exclusively and never through a link, in a folder that no other user can
# change (nor any folder above it), renamed into place only once what is on disk has the right checksum.
WRITER = """\
import hashlib, os, secrets, stat, sys
target, want = sys.argv[1], sys.argv[2]
os.umask(0o022)
folder, name = os.path.split(target)
os.makedirs(folder, mode=0o755, exist_ok=True)
real = path = os.path.realpath(folder)
while True:
    st = os.stat(path)
    shared = st.st_mode & 0o022 and not (path != real and st.st_mode & stat.S_ISVTX)
    if st.st_uid not in (0, os.geteuid()) or shared:
        sys.exit("deployctl: refusing to install into %s: another user can change %s" % (folder, path))
    if path == "/":
        break
    path = os.path.dirname(path)
dir_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
tmp = "." + name + "." + secrets.token_hex(8) + ".tmp"
flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
try:
    with os.fdopen(fd, "w+b") as out:
        while chunk := sys.stdin.buffer.read(1 << 16):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
        out.seek(0)
        have = hashlib.sha256(out.read()).hexdigest()  # what is on disk now, not what was sent
        if have != want:
            sys.exit("deployctl: the agent bundle arrived damaged (checksum %s, not %s)" % (have, want))
        os.fchmod(out.fileno(), 0o644)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)
except BaseException:
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except OSError:
        pass
    raise
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
