"""The command line: argument parsing, and the one place that turns errors into a line and an exit code."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from agent import __version__
from agent.cli.options import ArgError, parse_context, parse_fraction, parse_request_count
from agent.errors import DeployError, UsageError
from agent.exitcodes import ExitCode
from agent.output import Output

# name -> (module under agent.cli.commands, one-line help). Names are the public contract.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "predict the KV pool and choose the flags for a target context"),
    "render": ("render", "render the unit for a host and show its flag differences"),
    "apply": ("apply", "plan, render and apply a change on a host, with automatic rollback"),
    "rollback": ("rollback", "restore a backup of the unit and verify the service"),
    "backups": ("backups", "list a host's unit backups and their flag differences"),
    "status": ("status", "show a host's service and its running or last transaction"),
    "parse-log": ("parse_log", "summarise an SGLang startup log (pool, memory, failure)"),
    "adopt": ("adopt", "write a host's inventory from the SGLang unit it already runs"),
}


# C0, DEL and C1: a value echoed in a message must not move the cursor or recolour the terminal.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """One line fit for a terminal: control characters shown as escapes (\\n, \\x1b)."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() prints every error the same way."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, hint=f"see: {self.prog} --help")


def typed(parse: Callable[[str, str], Any], flag: str) -> Callable[[str], Any]:
    """Wrap a value parser for argparse's type=, keeping our one-line message."""

    def convert(text: str) -> Any:
        try:
            return parse(text, flag)
        except ArgError as exc:
            raise UsageError(str(exc)) from None

    convert.__name__ = flag.lstrip("-")
    return convert


def add_target_args(p: argparse.ArgumentParser, *, context_required: bool) -> None:
    """The flags shared by plan, render and apply."""
    p.add_argument("host", help="host name: units/<host>.toml")
    p.add_argument(
        "--context",
        required=context_required,
        type=typed(parse_context, "--context"),
        help="target context in tokens: 200000, 200k (x1000) or 128Ki (x1024)",
    )
    p.add_argument("--mem-fraction-static", type=typed(parse_fraction, "--mem-fraction-static"))
    p.add_argument(
        "--max-running-requests",
        type=typed(parse_request_count, "--max-running-requests"),
    )


def _add_common(p: argparse.ArgumentParser, *, top: bool) -> None:
    """--debug and --units work before and after the subcommand; the subcommand's copy never resets them."""
    default: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--debug", action="store_true", help="show tracebacks", **default)
    p.add_argument(
        "--units", metavar="DIR", help="inventory folder (default $DEPLOYCTL_UNITS or ./units)", **default
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="deployctl", description="Deploy SGLang under systemd and prove each change worked."
    )
    parser.add_argument("--version", action="version", version=f"deployctl {__version__}")
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common(p, top=False)
        try:
            mod = importlib.import_module(f"agent.cli.commands.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"agent.cli.commands.{module}":
                raise
            p.set_defaults(run=None)
            continue
        mod.configure(p)
        p.set_defaults(run=mod.run)
    return parser


def _refuse_dashes_value(args: Sequence[str]) -> None:
    """`--flag=--` is refused here: argparse (3.11) turns it into [] without calling the flag's parser."""
    for arg in args:
        name, eq, value = arg.partition("=")
        if arg.startswith("--") and eq and value == "--":
            raise UsageError(f"{name}: '--' is not a value", hint="see: deployctl --help")


def main(argv: Sequence[str] | None = None, out: Output | None = None) -> int:
    """Run one command; every expected failure ends as `deployctl: error: <one line>` and its code."""
    out = out or Output.from_process()
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        _refuse_dashes_value(args_list)
        args = build_parser().parse_args(args_list)
        if args.command is None:
            raise UsageError("a command is required", hint=f"one of: {', '.join(COMMANDS)}")
        if args.run is None:
            raise UsageError(f"'{args.command}' is not available in this version")
        return int(args.run(args, out))
    except DeployError as exc:
        if debug:
            traceback.print_exc(file=out.stderr)
        print(f"deployctl: error: {printable(exc.message)}", file=out.stderr)
        if exc.hint:
            print(f"deployctl: hint: {printable(exc.hint)}", file=out.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("deployctl: interrupted", file=out.stderr)
        return int(ExitCode.INTERRUPTED)
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0) if isinstance(exc.code, int) else 0
    except Exception as exc:  # a bug: one line, the traceback with --debug
        if debug:
            traceback.print_exc(file=out.stderr)
        print(
            f"deployctl: error: internal error: {type(exc).__name__}: {printable(str(exc))}", file=out.stderr
        )
        print("deployctl: hint: run again with --debug for the traceback", file=out.stderr)
        return int(ExitCode.INTERNAL)
