"""CLI: python -m tests.oracle size --config PATH [--draft PATH] [--gpu ct200|h100|JSON] [--env K=V] -- F"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from tests.oracle import GpuFigures, OracleRefusal, client, size
from tests.oracle.cases import HOSTS


def ship_cache(since: float) -> int:
    """Keep the answers used since `since` in the repository, so fresh machines start warm."""
    client.SHIPPED_CACHE.mkdir(exist_ok=True)
    used = [p for p in client.cache_dir().glob("*.json") if p.stat().st_mtime >= since]
    for path in used:
        shutil.copyfile(path, client.SHIPPED_CACHE / path.name)
    print(f"{len(used)} answers -> {client.SHIPPED_CACHE}", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.oracle")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("size", help="SGLang 0.5.23's KV pool for one start")
    one.add_argument("--config", required=True, help="a config.json or a folder holding one")
    one.add_argument("--draft", help="the draft model's config.json (or folder)")
    one.add_argument("--gpu", default="ct200", help=f"{sorted(HOSTS)} or a JSON object of GpuFigures")
    one.add_argument("--env", action="append", default=[], metavar="K=V")
    one.add_argument("flags", nargs=argparse.REMAINDER, help="SGLang flags, after --")
    ship = sub.add_parser("ship", help="copy the answers a test run used into tests/oracle/cache")
    ship.add_argument("--since", type=float, required=True, help="epoch seconds the run started")
    args = parser.parse_args(argv)
    if args.command == "ship":
        return ship_cache(args.since)

    def read(path: str) -> dict[str, object]:
        p = Path(path)
        data: dict[str, object] = json.loads((p / "config.json" if p.is_dir() else p).read_text())
        return data

    if args.gpu in HOSTS:
        gpu = HOSTS[args.gpu]
    else:
        raw = json.loads(args.gpu)
        gpu = GpuFigures(**{**raw, "capability": tuple(raw.get("capability", (9, 0)))})
    flags = [f for f in args.flags if f != "--"]
    env = dict(item.split("=", 1) for item in args.env)
    try:
        result = size(read(args.config), flags, env, gpu, read(args.draft) if args.draft else None)
    except OracleRefusal as exc:
        print(json.dumps({"refused": exc.error_type, "message": exc.message}, indent=1))
        return 3
    print(json.dumps({k: v for k, v in asdict(result).items() if k != "logs"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
