"""What SGLang 0.5.23's answer to `POST /pd_role_switch` means for a change (laptop and host read it alike).

The endpoint answers 200 with `PdRoleSwitchReqOutput` on success and 400 with the same object on a
rejection (srt/entrypoints/http_server.py:1635; srt/managers/io_struct.py:2277: success, message, old_role,
new_role, safe_to_restore). `safe_to_restore` is true for every rejection made before anything was torn down
(srt/disaggregation/role_switch.py:169 `_reject_reason`, :73 not idle, :85 the decode graphs' memory); a
teardown or rebuild that raised answers it false: "instance unhealthy, restart required" (role_switch.py:134).
The endpoint is ADMIN_OPTIONAL (http_server.py:1636): with --admin-api-key set only that key opens it, else
the --api-key (srt/utils/auth.py:160-170); a turned-away request is answered 401/403 by the auth middleware
before any handler ran (auth.py:192-203), so the server serves its old role untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PATH = "/pd_role_switch"
# io_struct.py:2272 PdRoleSwitchReqInput: "Measured graph footprint from a matching decode peer", which a
# decode's /get_server_info gives in each internal state (scheduler_components/internal_state.py:104)
GRAPH_FIELD = "decode_cuda_graph_memory_gb"
TURNED_AWAY = (401, 403)  # srt/utils/auth.py:192-203: {"error": "Unauthorized" | "Forbidden"}


class Said(str, Enum):
    SWITCHED = "switched"  # success (also "already in target role")
    REFUSED = "refused"  # success false, safe_to_restore: the server serves its old role as before
    BROKEN = (
        "broken"  # success false, not safe to restore (or no answer of SGLang's): the server is unhealthy
    )


@dataclass(frozen=True)
class Answer:
    said: Said
    message: str


def answer(code: int, body: object) -> Answer:
    """SGLang's reply as what it means; a body that is not its object is BROKEN: nothing says the server
    still serves its old role; one turned away at auth never reached the switch: refused."""
    if code in TURNED_AWAY:
        return Answer(
            Said.REFUSED, f"HTTP {code} from SGLang's auth ({str(body)[:200]}): check --admin-api-key"
        )
    if not isinstance(body, dict) or not isinstance(body.get("success"), bool):
        return Answer(Said.BROKEN, f"HTTP {code} without SGLang's answer: {str(body)[:200]}")
    message = str(body.get("message") or "")
    if body["success"]:
        return Answer(Said.SWITCHED, message or "ok")
    if body.get("safe_to_restore") is True:
        return Answer(Said.REFUSED, message)
    return Answer(Said.BROKEN, message)


def request_body(new_role: str, graph_gb: float | None) -> dict[str, object]:
    """The request: the role, and for a switch to decode the decode peer's measured graph memory."""
    body: dict[str, object] = {"new_role": new_role}
    if new_role == "decode" and graph_gb is not None:
        body[GRAPH_FIELD] = graph_gb
    return body


def switch_key(api_key: str | None, admin_api_key: str | None) -> str | None:
    """The bearer key /pd_role_switch takes (auth.py:160-170): the admin key where one is set (the API key
    is then refused), else the API key, else none."""
    return admin_api_key or api_key
