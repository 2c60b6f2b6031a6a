"""The command line: argument parsing, and the one place that turns errors into a line and an exit code."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from agent import __version__
from agent.cli import completion
from agent.cli.commands import adopt, apply, backups, facts, fleet, parse_log, plan, render, rollback, status
from agent.errors import DeployError, UsageError
from agent.exitcodes import ExitCode
from agent.output import Output, closed_pipe, encodable, terminal_text
from agent.sglang.flagrules import TABLE_VERSION

# name -> (its module: configure(parser) and run(args, out), one-line help). Names are the public contract.
COMMANDS: dict[str, tuple[ModuleType, str]] = {
    "plan": (plan, "predict the KV pool and choose the flags for a target context"),
    "render": (render, "render the unit for a host and show its flag differences"),
    "apply": (apply, "plan, render and apply a change on a host, with automatic rollback"),
    "rollback": (rollback, "restore a backup of the unit and verify the service"),
    "backups": (backups, "list a host's unit backups and their flag differences"),
    "status": (status, "show a host's service and its running or last transaction"),
    "fleet": (fleet, "roll a change across an inventory group on Ansible: canary, batches, halt"),
    "parse-log": (parse_log, "summarise an SGLang startup log (pool, memory, failure)"),
    "adopt": (adopt, "write a host's inventory from the SGLang unit it already runs"),
    "facts": (facts, "print what a host knows for planning (deployctl-facts/1)"),
}


# Exit status when stdout's reader went away before the command knew its outcome: what a shell reports
# for a process that SIGPIPE ended (128 + 13). Output.write keeps going instead wherever it can.
PIPE_CLOSED = int(ExitCode.PIPE_CLOSED)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() prints every error the same way. Epilogs keep
    their line breaks: each command's --help ends with examples, one a line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # a deploy tool does not guess: --for is not --force
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, hint=f"see: {self.prog} --help")


def _command_of(args: Sequence[str]) -> str:
    """`deployctl plan` or `deployctl fleet apply` for the words given, `deployctl` without a command."""
    words = [a for a in args if not a.startswith("-")]
    for i, word in enumerate(words):
        if word in COMMANDS:
            action = words[i + 1 : i + 2] if word == "fleet" else []
            return " ".join(["deployctl", word, *(a for a in action if a in ("apply", "status"))])
    return "deployctl"


def _with_help(hint: str | None, args: Sequence[str]) -> str:
    """Every usage error's hint ends by naming the --help that explains the command."""
    see = f"see: {_command_of(args)} --help"
    if hint is None:
        return see
    return hint if "--help" in hint else f"{hint}; {see}"


def _add_common(p: argparse.ArgumentParser, *, top: bool) -> None:
    """--debug and --units work before and after the subcommand; the subcommand's copy never resets them."""
    # argparse's own defaults at the top; the subcommand's copy leaves the attribute alone (SUPPRESS)
    p.add_argument(
        "--debug", action="store_true", help="show tracebacks", default=False if top else argparse.SUPPRESS
    )
    p.add_argument(
        "--units",
        metavar="DIR",
        help="inventory folder (default $DEPLOYCTL_UNITS or ./units)",
        default=None if top else argparse.SUPPRESS,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="deployctl", description="Deploy SGLang under systemd and prove each change worked."
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"deployctl {__version__} (flags checked against SGLang {TABLE_VERSION}'s own table)",
    )
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common(p, top=False)
        module.configure(p)
        for action in _nested(p):  # fleet apply|status: --units and --debug after the action too
            _add_common(action, top=False)
        p.set_defaults(run=module.run)
    return parser


def _parsers_for(parser: argparse.ArgumentParser, args: Sequence[str]) -> list[argparse.ArgumentParser]:
    """The parser and the (sub)command parsers the words choose: deployctl, plan; deployctl, fleet, apply."""
    chain = [parser]
    words = iter(a for a in args if not a.startswith("-"))
    while True:
        subs = [a for a in chain[-1]._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return chain
        word = next((w for w in words if w in subs[0].choices), None)
        if word is None:
            return chain
        chain.append(subs[0].choices[word])


def refuse_unknown_options(parser: argparse.ArgumentParser, args: Sequence[str]) -> None:
    """An option no parser on the way knows is named, with the closest one: before argparse's own
    checks, which would otherwise report a required option as missing (`--contxt 200k`)."""
    chain = _parsers_for(parser, args)
    known = sorted({o for p in chain for o in p._option_string_actions})
    for arg in args:
        if arg == "--":
            return
        name = arg.partition("=")[0]
        if name.startswith("-") and len(name) > 1 and name not in known and not _is_number(name):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            guess = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"unrecognized {name}{guess}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _nested(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of a command's own actions (fleet's apply and status)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [p for a in subs for p in a.choices.values()]


def _refuse_dashes_value(args: Sequence[str]) -> None:
    """`--flag=--` is refused here: argparse (3.11) turns it into [] without calling the flag's parser."""
    for arg in args:
        name, eq, value = arg.partition("=")
        if arg.startswith("--") and eq and value == "--":
            raise UsageError(f"{name}: '--' is not a value", hint="see: deployctl --help")


def _say(out: Output, line: str) -> None:
    """One line to stderr: no control character, and only what its encoding can write."""
    print(encodable(terminal_text(line, keep=""), out.stderr), file=out.stderr)


def _kept(out: Output, code: int) -> int:
    """The command's code, unless its output was lost on a stdout it could not write: then one line says
    so, and a command that would have exited 0 exits OUTPUT_LOST (a truncated `facts --json > file` is
    never a success)."""
    if out.lost is None:
        return code
    with contextlib.suppress(OSError, ValueError):
        _say(out, f"deployctl: error: cannot write the output: {out.lost}; what it printed is incomplete")
    return int(ExitCode.OUTPUT_LOST) if code == ExitCode.OK else code


def main(argv: Sequence[str] | None = None, out: Output | None = None) -> int:
    """Run one command; every expected failure ends as `deployctl: error: <one line>` and its code."""
    out = out or Output.from_process()
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        _refuse_dashes_value(args_list)
        parser = build_parser()
        completion.offer(parser)  # the shell asking for completions: answered, and the process ends
        refuse_unknown_options(parser, args_list)
        args = parser.parse_args(args_list)
        if args.command is None:
            raise UsageError("a command is required", hint=f"one of: {', '.join(COMMANDS)}")
        return _kept(out, int(args.run(args, out)))
    except DeployError as exc:
        if debug:
            traceback.print_exc(file=out.stderr)
        _say(out, f"deployctl: error: {exc.message}")
        hint = _with_help(exc.hint, args_list) if isinstance(exc, UsageError) else exc.hint
        if hint:
            _say(out, f"deployctl: hint: {hint}")
        return int(exc.exit_code)
    except BrokenPipeError:  # stdout's reader went away outside Output.write: drop the rest quietly
        closed_pipe(sys.stdout)
        return PIPE_CLOSED
    except KeyboardInterrupt:
        print("deployctl: interrupted", file=out.stderr)
        return int(ExitCode.INTERRUPTED)
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0) if isinstance(exc.code, int) else 0
    except Exception as exc:  # a bug: one line, the traceback with --debug
        if debug:
            traceback.print_exc(file=out.stderr)
        _say(out, f"deployctl: error: internal error: {type(exc).__name__}: {exc}")
        print("deployctl: hint: run again with --debug for the traceback", file=out.stderr)
        return int(ExitCode.INTERNAL)
