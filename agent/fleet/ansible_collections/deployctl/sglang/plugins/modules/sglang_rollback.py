# Documentation only: the action plugin of the same name does the work on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_rollback
short_description: Restore a backup of the SGLang unit through deployctl's transaction and verify it
options:
  to:
    description: The backup (default the newest that differs from the installed unit).
  units_dir:
    description: The inventory folder.
  host:
    description: The host file's name (default inventory_hostname).
"""


from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=False)
    module.fail_json(msg="deployctl.sglang.sglang_rollback runs through its action plugin on the controller")


if __name__ == "__main__":
    main()
