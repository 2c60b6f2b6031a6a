"""The units a change touches besides the plain engine, each in its role: the weight-cache daemon
(daemon.py, weight_cache.py), a group node (groupstep.py, groupnode.py, groupsignal.py,
grouprecovery.py) and the router step (routerstep.py, router.py)."""
