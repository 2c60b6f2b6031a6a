# Documentation only: the action plugin of the same name does the work on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_apply
short_description: Raise an SGLang context (or change its flags) with deployctl's plan, transaction and gate
description:
  - Runs on the controller. Plans the pool from the host's facts with deployctl's planner (its own last
    start plus the canaries' measured starts of the same GPU model, model, SGLang version and parallelism),
    renders the unit, and runs deployctl's host transaction over deployctl's own SSH client (the agent
    bundle is pushed only when its checksum differs; the transaction runs detached and is re-attached after
    a dropped connection).
  - C(failed) when the change was rolled back, the rollback failed, the plan cannot reach the target, or
    the host is unreachable (an unreachable host counts as failed, so it counts toward max_fail_percentage).
  - A host already at the target is a no-op (C(changed=false)).
  - Check mode (C(--check)) plans and renders only; C(changed) says whether the unit would change.
options:
  context:
    description: Target context, e.g. 200000, 200k or 128Ki.
    required: true
  canary:
    description: Publish the measured start as the fact deployctl_measured for later hosts to plan from.
    type: bool
    default: false
  measured_on:
    description: The hosts whose published measurements to read (default every host in the inventory).
    type: list
    elements: str
  units_dir:
    description: The inventory folder (default the inventory plugin's, else $DEPLOYCTL_UNITS or ./units).
  host:
    description: The host file's name (default inventory_hostname).
"""

RETURN = r"""
outcome:
  description: >-
    applied, up_to_date, would_change (check mode), rolled_back, rollback_failed, unreachable,
    not_feasible, error
plan: {description: "fraction, requests, predicted_pool, feasible, basis, calibrated_from"}
measured_pool: {description: the pool the new start logged}
target: {description: the target context}
backup: {description: the backup taken of the old unit}
smoke_seconds: {description: the smoke test's time}
downtime_s: {description: restart to ready}
revert: {description: the command that undoes the change}
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=False)
    module.fail_json(msg="deployctl.sglang.sglang_apply runs through its action plugin on the controller")


if __name__ == "__main__":
    main()
