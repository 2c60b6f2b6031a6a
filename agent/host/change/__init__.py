"""A change to units, in one place: its jobs and their record, the driver and its steps, its deciders.

transaction.py drives the steps (compare, write, restart, verify, commit, restore, recover), each a module
with its ports (ports.py); next_step.py decides what the driver does next and decide.py what a watched
start comes to. Before the first job runs, the change's ordered unit jobs (jobs.py) go into its record
(record.py); orphans.py finds a change whose agent died, folder.py keeps its request, bootguard.py keeps
a group node's uncommitted unit from starting at boot.
"""
