# The controller side of deployctl.sglang.sglang_apply: all logic lives in agent.fleet (typed, tested).
from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False  # deployctl reaches the host itself (its SSH rules, its agent bundle)
    _VALID_ARGS = frozenset(("context", "set", "canary", "measured_on", "units_dir", "host"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        from agent.fleet import plugin

        hostvars = task_vars.get("hostvars") or {}
        # Read only the canaries' facts when the play names them: each read merges a host's variables,
        # and reading every host for every host grows with the square of the fleet.
        names = self._task.args.get("measured_on") or list(hostvars)
        peers = [plugin.raw_fact(hostvars, name) for name in names]
        check = bool(self._task.check_mode)  # --check: plan and render only, nothing applied
        result.update(plugin.apply(dict(self._task.args), task_vars, [p for p in peers if p], check))
        return result
