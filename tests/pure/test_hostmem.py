"""The host agent's host-memory facts: /proc/meminfo, the unit's cgroup levels (v2) and the NUMA nodes."""

from __future__ import annotations

from pathlib import Path

from agent.host import hostmem

MEMINFO = """MemTotal:       263856012 kB
MemFree:         1024000 kB
MemAvailable:   201326592 kB
HugePages_Total:      16
HugePages_Free:       10
Hugepagesize:    1048576 kB
"""


def _cgroup(root: Path, path: str, **files: str) -> None:
    d = root / path
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_", ".")).write_text(text)


def test_meminfo_in_bytes_and_huge_pages_as_bytes() -> None:
    data = hostmem.host_memory(MEMINFO, 2, [])
    assert data is not None
    assert data["total"] == 263856012 * 1024 and data["available"] == 201326592 * 1024
    assert data["hugepages_total"] == 16 * 2**30 and data["hugepages_free"] == 10 * 2**30
    assert data["numa_nodes"] == 2 and data["cgroup"] == []
    assert hostmem.host_memory("MemTotal: 10 kB\n", 1, []) is None  # no MemAvailable: no figure


def test_limits_read_as_sglang_does() -> None:
    assert hostmem.parse_limit("max\n") is None and hostmem.parse_limit("68719476736\n") == 68719476736
    assert (
        hostmem.parse_file_cache("anon 5\nfile 5000\nactive_file 1000\ninactive_file 3096\nfile_mapped 7\n")
        == 4096
    )
    assert hostmem.level("x", {"memory.max": "10"}) is None  # no memory.current: no memory controller


def test_every_level_of_the_units_cgroup_innermost_first(tmp_path: Path) -> None:
    _cgroup(
        tmp_path, "system.slice", memory_max="max", memory_high="max", memory_current="900", memory_stat=""
    )
    stat = "anon 1000\nactive_file 1000\ninactive_file 2000\n"
    _cgroup(tmp_path, "system.slice/sglang-a.service", memory_max="68719476736", memory_high="max",
            memory_current="5000", memory_stat=stat)  # fmt: skip
    (tmp_path / "meminfo").write_text(MEMINFO)
    nodes = tmp_path / "node"
    for n in ("node0", "node1", "possible"):
        (nodes / n).mkdir(parents=True)
    data = hostmem.collect("sglang-a.service", str(tmp_path), str(tmp_path / "meminfo"), str(nodes))
    assert data is not None and data["numa_nodes"] == 2
    assert [lv["path"] for lv in data["cgroup"]] == ["system.slice/sglang-a.service", "system.slice"]
    inner = data["cgroup"][0]
    assert (inner["max"], inner["high"], inner["current"], inner["file"]) == (68719476736, None, 5000, 3000)
    # a unit that does not run has no cgroup: the slice it will start in, whose limits SGLang reads then
    other = hostmem.collect("sglang-b.service", str(tmp_path), str(tmp_path / "meminfo"), str(nodes))
    assert other is not None and [lv["path"] for lv in other["cgroup"]] == ["system.slice"]
    assert hostmem.collect("x.service", str(tmp_path), str(tmp_path / "none")) is None


def test_what_each_other_service_of_the_slice_holds_now(tmp_path: Path) -> None:
    """The budget gives back what a running neighbour holds (plan/hostplan.py with_neighbours_stopped)."""
    _cgroup(tmp_path, "system.slice", memory_max="max", memory_current="900", memory_stat="")
    _cgroup(
        tmp_path, "system.slice/sglang-a.service", memory_current="5000", memory_stat="active_file 3000\n"
    )
    _cgroup(
        tmp_path, "system.slice/sglang-b.service", memory_current="70000", memory_stat="inactive_file 1000\n"
    )
    _cgroup(tmp_path, "system.slice/sshd.socket", memory_current="1", memory_stat="")  # not a service
    _cgroup(tmp_path, "system.slice/x.service", memory_stat="")  # no memory controller: left out
    (tmp_path / "meminfo").write_text(MEMINFO)
    data = hostmem.collect("sglang-a.service", str(tmp_path), str(tmp_path / "meminfo"), str(tmp_path))
    assert data is not None and data["siblings"] == {"sglang-b.service": 69000}
    stopped = hostmem.collect("sglang-c.service", str(tmp_path), str(tmp_path / "meminfo"), str(tmp_path))
    assert stopped is not None and set(stopped["siblings"]) == {"sglang-a.service", "sglang-b.service"}
