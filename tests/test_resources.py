from __future__ import annotations

import pytest

from streambuf.resources import (
    Limits,
    cpu_limit,
    cpu_seconds,
    memory_limit,
    read_limits,
    recommend,
)

GIB = 1 << 30


def tree(tmp_path, files: dict[str, str], proc: str = "0::/\n"):
    for rel, text in files.items():
        p = tmp_path / "cg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (tmp_path / "proc_cgroup").write_text(proc)
    return {"root": tmp_path / "cg", "proc_cgroup": tmp_path / "proc_cgroup"}


def test_v2_quota_and_memory(tmp_path):
    roots = tree(tmp_path, {"cpu.max": "150000 100000\n", "memory.max": str(4 * GIB)})
    assert cpu_limit(**roots, affinity=16) == 1.5
    assert memory_limit(**roots, physical=64 * GIB) == 4 * GIB


def test_v2_unlimited_falls_back_to_affinity_and_physical(tmp_path):
    roots = tree(tmp_path, {"cpu.max": "max 100000\n", "memory.max": "max\n"})
    assert cpu_limit(**roots, affinity=3) == 3
    assert memory_limit(**roots, physical=8 * GIB) == 8 * GIB


def test_v2_nested_own_cgroup(tmp_path):
    roots = tree(
        tmp_path,
        {"kubepods/pod1/cpu.max": "200000 100000", "kubepods/pod1/memory.max": str(GIB)},
        proc="0::/kubepods/pod1\n",
    )
    assert cpu_limit(**roots, affinity=32) == 2
    assert memory_limit(**roots, physical=64 * GIB) == GIB


def test_v1_cfs_quota_and_limit(tmp_path):
    roots = tree(
        tmp_path,
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
            "memory/docker/abc/memory.limit_in_bytes": str(2 * GIB),
        },
        proc="4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
    )
    # v1 mounts each controller under its own folder name; the joined name is one folder
    assert cpu_limit(**roots, affinity=8) == 0.5
    assert memory_limit(**roots, physical=16 * GIB) == 2 * GIB


def test_v1_unlimited_and_no_quota(tmp_path):
    roots = tree(
        tmp_path,
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": str(9223372036854771712),
        },
        proc="4:cpu:/\n3:memory:/\n",
    )
    assert cpu_limit(**roots, affinity=4) == 4
    assert memory_limit(**roots, physical=16 * GIB) == 16 * GIB


def test_affinity_is_a_limit(tmp_path):
    roots = tree(tmp_path, {"cpu.max": "800000 100000"})
    assert cpu_limit(**roots, affinity=2) == 2


def test_recommend_respects_limits():
    small = recommend(limits=Limits(cpus=2, memory_bytes=4 * GIB), batch_bytes=256 << 20)
    assert small.num_workers == 2 and small.max_bytes <= 4 * GIB
    assert small.max_batches == 4  # 1 GiB budget / 256 MiB batches
    big = recommend(limits=Limits(cpus=16, memory_bytes=64 * GIB), io_bound=False)
    assert big.num_workers == 15 and big.threads == 1 and big.max_bytes == 16 * GIB
    assert all(isinstance(r, str) for r in big.reasons)
    with pytest.raises(ValueError):
        recommend(memory_fraction=0)


def test_read_limits_here_is_sane():
    lim = read_limits()
    assert lim.cpus > 0 and lim.memory_bytes > 0
    assert lim.cores and lim.suggested_workers and lim.cpus <= lim.suggested_workers
    assert lim.available_bytes is not None and 0 <= lim.available_bytes <= lim.memory_bytes


def test_cpu_seconds_reads_the_cgroup_then_the_machine(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 900 30 0 10 0 0 0\ncpu0 1 2 3 4\n")
    # v2: the own cgroup's usage
    roots = tree(tmp_path, {"pod/cpu.stat": "usage_usec 2500000\nuser_usec 1\n"}, "0::/pod\n")
    assert cpu_seconds(**roots, proc_stat=stat) == 2.5
    # v1: cpuacct.usage (nanoseconds)
    v1 = tmp_path / "v1"
    v1.mkdir()
    roots = tree(v1, {"cpuacct/docker/x/cpuacct.usage": "3000000000"}, "2:cpuacct:/docker/x\n")
    assert cpu_seconds(**roots, proc_stat=stat) == 3.0
    # neither: the machine's busy ticks (all but idle and iowait)
    none = tmp_path / "none"
    none.mkdir()
    roots = tree(none, {})
    import os

    assert cpu_seconds(**roots, proc_stat=stat) == 160 / os.sysconf("SC_CLK_TCK")


def test_cpu_seconds_here_counts_this_process_work():
    import time

    c0, t0 = cpu_seconds(), time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < 0.2:
        x += 1
    assert cpu_seconds() - c0 >= 0.1  # the container (or machine) was busy at least then
