"""Each test host's nspawn gets a control group of its own: two hosts started from one group would share
nspawn's "payload" group, and one host's systemd would then stop the other's server."""

from __future__ import annotations

from pathlib import Path

from tests.testhost.cgroups import enter_then_exec, hierarchies

HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_OWN = "9:name=systemd:/ci\n4:memory:/process_api/aadb\n0::/ci/job\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_mixed_machine_gives_the_name_systemd_and_the_cgroup2_folders_of_this_process() -> None:
    assert hierarchies(HYBRID_MOUNTS, HYBRID_OWN) == [
        Path("/sys/fs/cgroup/systemd/ci"),
        Path("/sys/fs/cgroup/unified/ci/job"),
    ]


def test_a_cgroup2_machine_gives_its_one_folder_and_other_controllers_are_left_alone() -> None:
    assert hierarchies(V2_MOUNTS, "0::/user.slice/session-1.scope\n") == [
        Path("/sys/fs/cgroup/user.slice/session-1.scope")
    ]
    assert hierarchies(HYBRID_MOUNTS, "4:memory:/x\n") == []


def test_nspawn_is_exec_ed_by_a_shell_that_first_joins_every_group() -> None:
    argv = enter_then_exec([Path("/a b"), Path("/c")], ["systemd-nspawn", "--boot"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["sh", "systemd-nspawn", "--boot"]
    assert "echo $$ > '/a b/cgroup.procs'" in argv[2] and argv[2].endswith('exec "$@"')
    assert enter_then_exec([], ["x"]) == ["x"]
