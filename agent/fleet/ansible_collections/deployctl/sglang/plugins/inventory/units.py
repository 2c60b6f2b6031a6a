# deployctl.sglang.units: the same units/*.toml deployctl reads, hosts and groups.
from __future__ import annotations

DOCUMENTATION = r"""
name: units
short_description: deployctl's units/*.toml as an Ansible inventory
description:
  - One host per units/<host>.toml; each name in the file's C(groups) list becomes a group.
  - The inventory file's name must end in C(deployctl.yml) or C(deployctl.yaml).
options:
  plugin:
    description: The name of this plugin.
    required: true
    choices: ["deployctl.sglang.units"]
  units_dir:
    description: The inventory folder; relative to the inventory file. Default $DEPLOYCTL_UNITS or ./units.
    type: str
"""

EXAMPLES = r"""
# fleet.deployctl.yml
plugin: deployctl.sglang.units
units_dir: /etc/deployctl/units
"""

import os
from pathlib import Path

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin


class InventoryModule(BaseInventoryPlugin):
    NAME = "deployctl.sglang.units"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("deployctl.yml", "deployctl.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        from agent.errors import DeployError
        from agent.fleet.inventory import all_hosts
        from agent.inventory import units_dir

        folder = units_dir(self.get_option("units_dir"))
        if not folder.is_absolute():
            folder = (Path(os.path.abspath(path)).parent / folder).resolve()
        try:
            hosts = all_hosts(folder)
        except DeployError as exc:
            raise AnsibleParserError(exc.message) from None
        for host in hosts:
            self.inventory.add_host(host.name)
            for group in host.groups:
                self.inventory.add_group(group)
                self.inventory.add_child(group, host.name)
            self.inventory.set_variable(host.name, "deployctl_units_dir", str(folder))
            self.inventory.set_variable(host.name, "deployctl_unit", host.unit.name)
            self.inventory.set_variable(host.name, "deployctl_gpu", host.gpus.name)
        # Ansible forks each host's worker from this process (ansible-playbook's own): the action
        # plugins' code imported here (SSH, planner, renderer: 0.25 s) is inherited, not imported again
        # by every worker; four at once on 2 cores paid 0.4-0.7 s at the start of each batch.
        import agent.fleet.plugin  # noqa: F401
