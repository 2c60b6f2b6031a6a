"""The layers of agent/ (tests/layers.py): one direction, every module placed, the longest name wins."""

from __future__ import annotations

from tests.house import import_cycles
from tests.layers import LAYERS, below, layer_of, layer_violations


def test_the_layers_go_one_direction() -> None:
    """No layer is below itself: the arrows between layers make no circle."""
    for name in LAYERS:
        assert name not in below(name)
    assert import_cycles({name: set(down) for name, (_, down) in LAYERS.items()}) == []


def test_the_longest_module_name_decides_the_layer() -> None:
    assert layer_of("agent.group.apply") == "group"
    assert layer_of("agent.group.nodes") == "model"
    assert layer_of("agent.sglang.logs.summary") == "base"
    assert layer_of("agent.host.change.next_step") == "host"
    assert layer_of("agent") == "base"


def test_an_import_down_is_fine_and_one_up_or_sideways_is_a_violation() -> None:
    graph = {
        "agent.cli.main": {"agent.deploy", "agent.protocol.events"},  # down, two layers and more
        "agent.render": {"agent.host.watch.drain", "agent.inventory"},  # sideways to the host
        "agent.remote.client": {"agent.orchestrate.session"},  # up
        "agent.host.watch.drain": {"agent.protocol.events"},
        "agent.deploy": set(),
        "agent.protocol.events": set(),
        "agent.inventory": set(),
        "agent.orchestrate.session": set(),
    }
    assert layer_violations(graph) == [
        "agent.remote.client -> agent.orchestrate.session (remote -> orchestrate)",
        "agent.render -> agent.host.watch.drain (pure -> host)",
    ]


def test_a_module_in_no_layer_is_counted() -> None:
    assert layer_violations({"agent.newthing": set()}) == ["agent.newthing: in no layer"]
