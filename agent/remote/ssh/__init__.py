"""SSH on paramiko: config, authentication, host keys, the transport and its failures.

paramiko imports invoke (and unittest.mock with it: about a fifth of deployctl's start-up) only to run
`Match exec` lines of an ssh config. It is kept out here and loaded by config.load_config when a config
really has such a line (see paramiko/config.py: a failed import is kept and raised only when used).
"""

from __future__ import annotations

import sys

if "paramiko" not in sys.modules:
    sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]
