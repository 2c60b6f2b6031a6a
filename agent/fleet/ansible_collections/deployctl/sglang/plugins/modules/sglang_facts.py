# Documentation only: the action plugin of the same name does the work on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_facts
short_description: The running SGLang unit, its measured pool and drift from what the plan renders
options:
  context:
    description: Target context; drift is against the plan for it (else against the inventory baseline).
  units_dir:
    description: The inventory folder.
  host:
    description: The host file's name (default inventory_hostname).
"""


from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=False)
    module.fail_json(msg="deployctl.sglang.sglang_facts runs through its action plugin on the controller")


if __name__ == "__main__":
    main()
