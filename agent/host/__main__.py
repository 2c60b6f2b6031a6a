"""`python3 -m agent.host VERB` (or the bundle): a Request on stdin, JSON on stdout.

`session` instead takes one JSON request per line: a read-only verb, answered at once, then optionally
one changing verb. deployctl asks for facts and sends the apply planned from them to the same agent
process over one SSH channel, so a run that changes nothing costs one call; EOF after the answer ends it.
"""

from __future__ import annotations

import sys
from typing import TextIO

from agent.exitcodes import ExitCode
from agent.protocol.common import TXN_ID, ProtocolError
from agent.protocol.requests import Request

SESSION_FIRST = ("facts", "status")
SESSION_SECOND = ("apply", "rollback", "recover")


def main(argv: list[str]) -> int:
    from agent.host import runner  # after argv checks: a bad call fails fast and cheaply

    if len(argv) == 3 and argv[1] == "run":
        if not argv[0].startswith("/") or TXN_ID.fullmatch(argv[2]) is None:
            print("deployctl-agent: error: bad state directory or transaction id", file=sys.stderr)
            return int(ExitCode.USAGE)
        return runner.run(argv[0], argv[2])
    if len(argv) != 1:
        print("usage: agent.host VERB < request.json  |  agent.host STATE_DIR run TXN", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        if argv[0] == "session":
            return session(sys.stdin, sys.stdout)
        return _dispatch(_request(sys.stdin.read(), (argv[0],)), sys.stdout)
    except ProtocolError as exc:
        print(f"deployctl-agent: error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)


def session(inp: TextIO, out: TextIO) -> int:
    rc = _dispatch(_request(inp.readline(), SESSION_FIRST), out)
    out.flush()  # the caller plans from this answer before it sends anything more
    line = inp.readline()
    if not line.strip():
        return rc
    return _dispatch(_request(line, SESSION_SECOND), out)


def _request(text: str, verbs: tuple[str, ...]) -> Request:
    req = Request.from_json(text)
    if req.verb not in verbs:
        raise ProtocolError(f"verb {req.verb!r} where {' or '.join(map(repr, verbs))} was expected")
    return req


def _dispatch(req: Request, out: TextIO) -> int:
    from agent.host import verbs

    return verbs.dispatch(req, out)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
