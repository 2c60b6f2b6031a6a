from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("context", "units_dir", "host"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        from agent.fleet import plugin

        result.update(plugin.facts(dict(self._task.args), task_vars or {}))
        return result
