"""Log lines of the simulated SGLang server, in SGLang's and uvicorn's formats, flushed one by one."""

from __future__ import annotations

import sys
import threading
import time
from typing import BinaryIO

# Noise for the garbage fault: invalid UTF-8, a 70k-character line, ANSI escapes, a NUL, near misses.
GARBAGE = [
    b"\xff\xfe\xfd\xc3\x28 not utf-8 \xe2\x82\n",
    b"W" * 70000 + b"\n",
    b"\x1b[31m\x1b[1mNCCL WARN\x1b[0m net.cc:114 NCCL_SOCKET_IFNAME unset\n",
    b"garbage \x00 with a NUL byte\n",
    b"[not a time TPx] KV Cache is allocated. #tokens: unknown\n",
    b"\r\r\r   \r\n",
    b"{'partial': 'json', \n",
]


def traceback_lines(site: str, frames: list[tuple[str, int, str, str]], error: str) -> list[str]:
    """Frame and error lines of a Python traceback (the header line is the caller's)."""
    lines: list[str] = []
    for path, lineno, func, code in frames:
        lines += [f'  File "{site}/{path}", line {lineno}, in {func}', f"    {code}"]
    return lines + error.split("\n")


class Out:
    """Writes prefixed lines to stderr (SGLang's logger) and uvicorn's access log to stdout."""

    def __init__(self, tp: int, dp: int, garbage: bool) -> None:
        self.tp, self.dp, self.garbage = tp, dp, garbage
        self.lock = threading.RLock()
        self.count = 0

    def tag(self, rank: int | None) -> str:
        """' DP0 TP3' for a scheduler rank, '' for the main process; a tag only for a dimension > 1."""
        if rank is None:
            return ""
        dp = f" DP{rank // self.tp}" if self.dp > 1 else ""
        tp = f" TP{rank % self.tp}" if self.tp > 1 else ""
        return dp + tp

    def write(self, stream: BinaryIO, data: bytes) -> None:
        with self.lock:
            self.count += 1
            if self.garbage and self.count % 3 == 0:
                sys.stdout.buffer.write(GARBAGE[(self.count // 3) % len(GARBAGE)])
                sys.stdout.buffer.flush()
            stream.write(data)
            stream.flush()

    def log(self, message: str, rank: int | None = None) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.write(sys.stderr.buffer, f"[{stamp}{self.tag(rank)}] {message}\n".encode())

    def raw(self, text: str, end: str = "\n") -> None:
        self.write(sys.stderr.buffer, (text + end).encode())

    def uvicorn(self, message: str, access: bool = False, level: str = "INFO") -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = f"[{stamp}] {level + ':':<9} {message}\n".encode()
        self.write(sys.stdout.buffer if access else sys.stderr.buffer, line)
