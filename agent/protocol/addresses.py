"""One host's identity, however its SSH target or a URL spells it.

`gpu-pd`, `root@gpu-pd`, `gpu-pd:22` and `GPU-PD` are one machine: what two units of it must not share is
grouped by this key. An ssh config alias of the same machine (Host a / HostName gpu-pd) is not resolved:
that needs the config of the machine that connects, and these checks are made from the inventory alone.
"""

from __future__ import annotations

import ipaddress


def host_key(target: str) -> str:
    """The host name of an SSH target: user@ and :port dropped, brackets off an IPv6 address, lower case."""
    rest = target.strip().rpartition("@")[2]
    if rest.startswith("["):
        rest = rest[1:].partition("]")[0]
    elif rest.count(":") == 1:  # host:port; an IPv6 address without brackets keeps its colons
        rest = rest.partition(":")[0]
    return rest.rstrip(".").lower()


def same_host(a: str, b: str) -> bool:
    return host_key(a) == host_key(b)


def loopback(address: str) -> bool:
    """An address only its own host reaches: 127.0.0.0/8, ::1 (also IPv4-mapped), localhost in any case."""
    name = address.strip().strip("[]").rstrip(".").lower().partition("%")[0]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
