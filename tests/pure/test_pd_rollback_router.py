"""A [pd] rollback's members and the running router: while the router's unit stays, each role's unit that
restarts is drained through it and put back with its role (pdapply.through_router, as an apply's member);
a router that goes back itself registers every unit anew from its command line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.group.pdrollback import chosen_backups, rollback_nodes
from agent.pd.units import pd_units
from tests.pure.test_pd import example, host_of
from tests.pure.test_pd_ops import DECODE_BAK, PREFILL, backups_of

ROUTER_BAK = "llama-pd-router.service.bak.20261206T120000Z"
BAKS = (f"{PREFILL}.bak.20261206T120000Z", DECODE_BAK, ROUTER_BAK)


@given(changed=st.tuples(st.booleans(), st.booleans(), st.booleans()).filter(any))
def test_each_restarted_role_leaves_the_router_that_stays(changed: tuple[bool, bool, bool]) -> None:
    host = host_of(example())
    # a decode re-registers after its prefill goes back: it restarts on a copy of its own unit
    listings = [backups_of((b, not c)) for b, c in zip(BAKS, changed, strict=True)]
    picked = chosen_backups(host, listings)  # type: ignore[arg-type]
    nodes, _ = rollback_nodes(host, picked, [object()] * len(picked))  # type: ignore[list-item]
    router_stays = not changed[2]
    roles = pd_units(host)
    for c, node in zip(picked, nodes, strict=True):
        req = node.request
        if c.label == "router" or not router_stays:
            assert req.router_url is None and req.router_worker_url is None
            continue
        unit = roles[c.index]
        assert req.router_url is not None and req.router_worker_url == unit.url
        assert req.router_worker_type == unit.role.value
        assert req.router_bootstrap_port == unit.bootstrap_port  # a prefill's; a decode's None
