"""`python3 -m agent.host VERB` (or the bundle): a Request on stdin, JSON on stdout."""

from __future__ import annotations

import sys

from agent.exitcodes import ExitCode
from agent.protocol import TXN_ID, ProtocolError, Request


def main(argv: list[str]) -> int:
    from agent.host import runner, verbs  # after argv checks: a bad call fails fast and cheaply

    if len(argv) == 3 and argv[1] == "run":
        if not argv[0].startswith("/") or TXN_ID.fullmatch(argv[2]) is None:
            print("deployctl-agent: error: bad state directory or transaction id", file=sys.stderr)
            return int(ExitCode.USAGE)
        return runner.run(argv[0], argv[2])
    if len(argv) != 1:
        print("usage: agent.host VERB < request.json  |  agent.host STATE_DIR run TXN", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        req = Request.from_json(sys.stdin.read())
        if req.verb != argv[0]:
            raise ProtocolError(f"verb {argv[0]!r} does not match the request's {req.verb!r}")
    except ProtocolError as exc:
        print(f"deployctl-agent: error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    return verbs.dispatch(req, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
