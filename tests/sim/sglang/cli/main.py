"""`sglang serve ...`, the entrypoint SGLang 0.5.23 recommends (sglang/cli/main.py there): the same server."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "serve":
        sys.exit("usage: sglang serve --model-path <model> [options]")
    from sglang.launch_server import main as launch

    launch(args[1:])
