"""What a change watches: a start's journal to its verdict (start.py, journal.py), the drain (drain.py,
drainer.py), the HTTP checks (probe.py, loadcheck.py, serverinfo.py), the GPU processes (gpu_procs.py,
gpu_at_start.py), the downtime (timeline.py), and the bounded poll the background changes use (poll.py)."""
