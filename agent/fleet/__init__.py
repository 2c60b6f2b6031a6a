"""Fleet rollouts on Ansible: the collection deployctl.sglang (ansible_collections/) and its front end.

Ansible brings batches, failure thresholds, forks and inventories; deployctl brings the plan, the host
transaction and the pool gate. The plugins stay thin: they call the functions in this package.
"""
