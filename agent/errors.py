"""One error tree: every error carries its exit code, a one-line message and an optional hint."""

from __future__ import annotations

from agent.exitcodes import ExitCode


class DeployError(Exception):
    """An expected failure: printed as one line by cli.main, never as a traceback."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = " ".join(message.split()) or type(self).__name__
        self.hint = hint


class UsageError(DeployError):
    exit_code = ExitCode.USAGE


class InventoryError(UsageError):
    pass


class RenderError(UsageError):
    pass


class ConnectError(DeployError):
    exit_code = ExitCode.UNREACHABLE


class RemoteError(DeployError):
    """The host agent failed in a way that is not one of the outcomes above."""

    exit_code = ExitCode.INTERNAL
