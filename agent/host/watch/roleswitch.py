"""SGLang's runtime role switch over HTTP (`POST /pd_role_switch`), and the decode peer's measured graph
memory a switch to decode needs (its `/get_server_info`): the host-side edge of a [pd] role switch
(host/roles/pdswitch.py decides what to do with the answer)."""

from __future__ import annotations

from typing import Any, Protocol

from agent.sglang.roleswitch import GRAPH_FIELD, PATH, switch_key

SWITCH_TIMEOUT_S = 600.0  # a flip to decode captures the decode CUDA graphs before it answers


class RoleSwitchPort(Protocol):
    def switch(self, body: dict[str, object]) -> tuple[int, object]:
        """SGLang's HTTP status and JSON body; OSError-like failures raise RoleSwitchError."""
        ...

    def graph_gb(self, peer_url: str) -> float | None:
        """The decode peer's decode_cuda_graph_memory_gb, or None where it does not say."""
        ...


class RoleSwitchError(Exception):
    """No answer: the request may or may not have reached the server."""


class HttpRoleSwitch:
    def __init__(self, base: str, api_key: str | None, admin_api_key: str | None = None) -> None:
        import requests  # only when a switch is due

        self.base = base.rstrip("/")
        self.session = requests.Session()
        self.session.trust_env = False  # as the probe: no proxy, .netrc or CA bundle from the environment
        if api_key:  # the peer's /get_server_info is a normal endpoint: the API key (auth.py:172-176)
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        key = switch_key(api_key, admin_api_key)  # the switch is ADMIN_OPTIONAL (http_server.py:1636)
        self.switch_headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._errors: tuple[type[Exception], ...] = (requests.RequestException, ValueError)

    def switch(self, body: dict[str, object]) -> tuple[int, object]:
        try:
            r = self.session.post(
                f"{self.base}{PATH}", json=body, headers=self.switch_headers, timeout=SWITCH_TIMEOUT_S
            )
        except self._errors as exc:
            raise RoleSwitchError(f"POST {self.base}{PATH} failed: {exc}") from None
        try:
            return r.status_code, r.json()
        except self._errors:
            return r.status_code, r.text[:200]

    def graph_gb(self, peer_url: str) -> float | None:
        try:
            r = self.session.get(f"{peer_url.rstrip('/')}/get_server_info", timeout=30)
            data: Any = r.json() if r.status_code == 200 else None
        except self._errors:
            return None
        states = data.get("internal_states") if isinstance(data, dict) else None
        first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        value = first.get(GRAPH_FIELD)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def http_role_switch(host: str, port: int, api_key: str | None, admin_api_key: str | None) -> RoleSwitchPort:
    from agent.host.watch.probe import url_host

    return HttpRoleSwitch(f"http://{url_host(host)}:{port}", api_key, admin_api_key)
