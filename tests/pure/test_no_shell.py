"""No shell string is ever built from input: the code is scanned for shells and string commands.

A command is an argv list everywhere; the one place where argv becomes a shell string is
agent.remote.transport.remote_command (SSH's exec request needs one), and paramiko's exec_command only ever
gets its result.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = sorted(p for folder in ("agent", "tests") for p in (ROOT / folder).rglob("*.py"))
SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output"}
ALWAYS_SHELL = {
    ("os", "system"),
    ("os", "popen"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
}
QUOTING = "remote_command"


def _dotted(node: ast.expr) -> tuple[str, ...]:
    """`a.b.c` -> ('a', 'b', 'c'); anything else -> ()."""
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return (*head, node.attr) if head else ()
    return ()


def _is_text(node: ast.expr, strings: set[str]) -> bool:
    """An expression that builds a str: a literal, an f-string, + or % on one, .format/.join, shlex.join."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Name):
        return node.id in strings
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _is_text(node.left, strings) or _is_text(node.right, strings)
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        if name[-2:] == ("shlex", "join") or name[-1:] == ("quote",):
            return True
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "join"):
            return _is_text(node.func.value, strings)
    return False


def _string_names(tree: ast.AST) -> set[str]:
    """Names assigned a str expression anywhere in the module (a command kept in a variable first)."""
    names: set[str] = set()
    for _ in range(2):  # twice: `a = "x"; b = a + "y"` in any order
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _is_text(node.value, names):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _command_arg(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "args"), None)


def _subprocess_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names the module calls subprocess by, and the functions it imported from it."""
    modules, functions = {"subprocess"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "subprocess"}
        elif isinstance(node, ast.ImportFrom) and node.module == "subprocess":
            functions |= {a.asname or a.name for a in node.names if a.name in SUBPROCESS}
    return modules, functions


def findings(source: str, where: str = "<source>") -> list[str]:
    """Every shell, string command and unquoted exec_command in the source, as `where:line: what`."""
    tree = ast.parse(source)
    strings = _string_names(tree)
    modules, functions = _subprocess_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        at = f"{where}:{node.lineno}"
        for k in node.keywords:
            if k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                found.append(f"{at}: shell= given")
        if name[-2:] in ALWAYS_SHELL:
            found.append(f"{at}: {'.'.join(name)} runs a shell")
        direct = len(name) == 1 and name[0] in functions
        if direct or (len(name) == 2 and name[0] in modules and name[1] in SUBPROCESS):
            arg = _command_arg(node)
            if arg is not None and _is_text(arg, strings):
                found.append(f"{at}: {'.'.join(name)} with a string command")
        if name[-1:] == ("exec_command",):
            arg = _command_arg(node) or (node.keywords[0].value if node.keywords else None)
            quoted = isinstance(arg, ast.Call) and _dotted(arg.func)[-1:] == (QUOTING,)
            if not quoted:
                found.append(f"{at}: exec_command with something other than {QUOTING}(argv, sudo)")
    return found


def test_no_shell_and_no_string_command_anywhere() -> None:
    assert len(SCANNED) > 50  # the scan really sees the code
    found = [f for p in SCANNED for f in findings(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert found == []


def test_the_one_quoting_function_builds_the_ssh_command() -> None:
    uses = [p for p in SCANNED if "exec_command(" in p.read_text(encoding="utf-8")]
    assert [str(p.relative_to(ROOT)) for p in uses if p.parts[len(ROOT.parts)] == "agent"] == [
        "agent/remote/ssh/transport.py"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess\nsubprocess.run('ls -l', check=True)",
        "import subprocess\nsubprocess.run(['ls'], shell=True)",
        "import subprocess\nsubprocess.Popen(f'ls {path}')",
        "import subprocess\ncmd = 'ls ' + path\nsubprocess.check_output(cmd)",
        "import subprocess, shlex\nsubprocess.run(shlex.join(argv))",
        "import subprocess\nsubprocess.call(args='rm -rf %s' % path)",
        "from subprocess import run\nrun('ls')",
        "import subprocess as sp\nsp.check_call('ls')",
        "import os\nos.system('ls')",
        "import os\nos.popen('ls')",
        "import subprocess\nsubprocess.getoutput(['ls'])",
        "chan.exec_command('ls ' + path)",
        "chan.exec_command(shlex.join(argv))",
        "client.exec_command(command=cmd)",
    ],
)
def test_the_scan_catches_each_kind(source: str) -> None:
    assert len(findings(source)) == 1, findings(source)


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess\nsubprocess.run(['ls', '-l'], check=True, shell=False)",
        "import subprocess\nsubprocess.run([*argv, name])",
        "chan.exec_command(remote_command(argv, self.sudo))",
        "text = 'a' + b\nprint(text)",
        "def run(x): ...\nrun('not a command')",
    ],
)
def test_argv_lists_pass_the_scan(source: str) -> None:
    assert findings(source) == []
