"""The laptop's orchestration layer, below the CLI and above remote/: what a person asks for (asked.py:
Connection, Change), one host's session (session.py), which `deploy.py` (one host) and `group/` (a group)
both use, so that neither imports the module that calls it. The fleet's runs (fleet/hostrun.py,
fleet/grouprun.py) share fleet/steps.py the same way."""
