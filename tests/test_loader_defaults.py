"""``sb.Loader(pipe)`` with nothing else set: ``num_workers``, ``max_batches`` and
``max_bytes`` default to ``"auto"``, chosen in one place (``streambuf.resources.
loader_defaults``, a pure function of the ``Limits``) from the CPU and memory limits,
logged once (docs/defaults.md). Limits come from fake cgroup trees here; the real
Loader is shown to use the same function by handing it fake limits."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
import streambuf.loader as loader_mod
from streambuf.resources import (
    MAX_BYTES_CEILING,
    MAX_BYTES_FLOOR,
    Limits,
    auto_max_bytes,
    loader_defaults,
    memory_available,
    read_limits,
    recommend,
    torch_suggested_workers,
)

pytestmark = pytest.mark.timeout(120)

GIB = 1 << 30
MIB = 1 << 20
TORCH_WARNING = "suggested max number of worker"


def tree(tmp_path: Path, files: dict[str, str], proc: str = "0::/\n") -> dict[str, Path]:
    """A fake cgroup tree (``root``) and ``/proc/self/cgroup`` (``proc_cgroup``)."""
    for rel, text in files.items():
        p = tmp_path / "cg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (tmp_path / "proc_cgroup").write_text(proc)
    return {"root": tmp_path / "cg", "proc_cgroup": tmp_path / "proc_cgroup"}


def machine(tmp_path: Path, files: dict[str, str], *, cpus: int = 16, **kw: Any) -> Limits:
    """``read_limits`` of a fake tree on a machine with ``cpus`` cores (all in the
    affinity), 64 GiB of memory, 60 GiB of it available, unless ``kw`` says otherwise."""
    kw = {"physical": 64 * GIB, "system_available": 60 * GIB, "cores": cpus, **kw}
    return read_limits(**tree(tmp_path, files), affinity=cpus, **kw)


def tiny_pipe() -> sb.Pipeline:
    return sb.Pipeline(list(range(64))).batch(8)


def items(loader: sb.Loader) -> list[int]:
    return sorted(int(x) for batch in loader for x in batch)


def defaults_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "streambuf" and r.getMessage().startswith("streambuf.Loader: ")
    ]


# -- the choice, from fake cgroup trees ------------------------------------------------
def test_a_quota_of_one_and_a_half_cpus_gives_one_worker(tmp_path: Path) -> None:
    lim = machine(tmp_path, {"cpu.max": "150000 100000\n"})
    assert lim.cpus == 1.5
    d = loader_defaults(lim)
    assert (d.num_workers, d.max_batches) == (1, 4)
    assert d.reasons[0] == "1 CPU, by cgroup quota and affinity: 1.5"
    assert d.auto == (True, True, True)


def test_affinity_of_eight_in_a_cgroup_of_two_gives_two_workers(tmp_path: Path) -> None:
    lim = machine(tmp_path, {"cpu.max": "200000 100000\n"}, cpus=8)
    d = loader_defaults(lim)
    assert (d.num_workers, d.max_batches) == (2, 8)
    # no quota: the affinity (one CPU left for the training loop above two)
    assert loader_defaults(machine(tmp_path / "free", {"cpu.max": "max 100000\n"}, cpus=8)) == (
        loader_defaults(Limits(8, 64 * GIB, cores=8, suggested_workers=8, available_bytes=60 * GIB))
    )
    assert loader_defaults(Limits(8, 64 * GIB)).num_workers == 7


def test_never_more_workers_than_the_cores_or_torch_suggests(tmp_path: Path) -> None:
    # an affinity mask wider than the cores the machine reports: the cores bound it
    d = loader_defaults(machine(tmp_path, {}, cpus=16, cores=4))
    assert d.num_workers == 3 and "the machine's cores" in d.reasons[0]
    # torch's DataLoader warns above its own count: never above it
    d = loader_defaults(Limits(cpus=16, memory_bytes=64 * GIB, cores=16, suggested_workers=2))
    assert d.num_workers == 2 and "torch's suggested max" in d.reasons[0]
    # torch cannot tell (it warns for any worker): none
    assert loader_defaults(Limits(16, 64 * GIB, suggested_workers=0)).num_workers == 0
    # on this machine: what torch counts (affinity, else os.cpu_count())
    import torch

    counted = getattr(torch._utils, "cpu_count", None)
    if counted is not None:
        assert torch_suggested_workers() == counted()
    here = read_limits()
    assert here.suggested_workers == torch_suggested_workers()
    assert here.cores == os.cpu_count()
    assert 1 <= loader_defaults(here).num_workers <= min(here.cores or 1, here.suggested_workers)


def test_a_small_memory_limit_means_fewer_workers_and_a_smaller_max_bytes(
    tmp_path: Path,
) -> None:
    big = loader_defaults(machine(tmp_path / "big", {"memory.max": "max\n"}, cpus=8))
    assert big.num_workers == 7 and big.max_bytes == 15 * GIB  # 25% of 60 GiB available
    # a 4 GiB limit, 1 GiB of it used: 3 GiB available; 512 MiB a worker in half of 4 GiB
    lim = machine(
        tmp_path / "small", {"memory.max": str(4 * GIB), "memory.current": str(GIB)}, cpus=8
    )
    assert (lim.memory_bytes, lim.available_bytes) == (4 * GIB, 3 * GIB)
    small = loader_defaults(lim)
    assert small.num_workers == 4 and "512 MiB a worker" in small.reasons[0]
    assert small.max_batches == 16
    assert small.max_bytes == 768 * MIB
    assert small.reasons[2] == "25% of 3.0 GiB available"
    # a tiny limit: one worker still, and the floor
    tiny = loader_defaults(
        machine(tmp_path / "tiny", {"memory.max": str(GIB), "memory.current": str(900 * MIB)})
    )
    assert tiny.num_workers == 1 and tiny.max_bytes == MAX_BYTES_FLOOR
    assert "floor" in tiny.reasons[2]


def test_memory_available_is_the_cgroup_room_within_the_machine(tmp_path: Path) -> None:
    roots = tree(tmp_path, {"memory.max": str(4 * GIB), "memory.current": str(GIB)})
    assert memory_available(**roots, physical=64 * GIB, system_available=60 * GIB) == 3 * GIB
    assert memory_available(**roots, physical=64 * GIB, system_available=2 * GIB) == 2 * GIB
    v1 = tmp_path / "v1"
    v1.mkdir()
    roots = tree(
        v1,
        {
            "memory/job/memory.limit_in_bytes": str(8 * GIB),
            "memory/job/memory.usage_in_bytes": str(6 * GIB),
        },
        proc="3:memory:/job\n",
    )
    assert memory_available(**roots, physical=64 * GIB, system_available=60 * GIB) == 2 * GIB


def test_max_bytes_share_floor_and_ceiling() -> None:
    assert auto_max_bytes(4 * GIB) == (GIB, "25% of 4.0 GiB available")
    assert auto_max_bytes(100 * MIB)[0] == MAX_BYTES_FLOOR
    assert auto_max_bytes(1 << 40)[0] == MAX_BYTES_CEILING
    assert "ceiling" in auto_max_bytes(1 << 40)[1]


def test_max_bytes_auto_covers_the_fixed_stage_buffers_or_says_what_to_pin() -> None:
    # twice the fixed buffers (the Loader refuses a max_bytes they take over half of)
    value, why = auto_max_bytes(4 * GIB, fixed_bytes=700 * MIB)
    assert value == 1400 * MIB and "fixed stage buffers" in why
    # per copy: one per worker
    lim = Limits(cpus=3, memory_bytes=16 * GIB, available_bytes=4 * GIB)
    d = loader_defaults(lim, fixed_bytes_per_copy=300 * MIB)
    assert d.num_workers == 2 and d.max_bytes == 1200 * MIB
    # more than half of what is available: a clear error, not a Loader that cannot start
    with pytest.raises(ValueError, match=r"max_bytes >= \d+ .*pin it, e\.g\. max_bytes="):
        auto_max_bytes(GIB, fixed_bytes=300 * MIB)


def test_a_real_loader_takes_more_than_the_share_for_a_large_pack_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pack's block: 12 bytes a token, so 12M tokens need max_bytes >= 288 MB, above the
    # 256 MiB a 1 GiB availability gives
    pipe = sb.Pipeline([{"tokens": [1, 2, 3]}]).pack(12_000_000, eos=0)
    fixed = pipe._fixed_stage_bytes()
    lim = Limits(cpus=1, memory_bytes=8 * GIB, available_bytes=GIB)
    monkeypatch.setattr(loader_mod, "read_limits", lambda: lim)
    loader = sb.Loader(pipe, timeout_s=30)
    assert loader.num_workers == 1 and loader.max_bytes == 2 * fixed
    # given explicitly, the same value is accepted; auto with too little memory says so
    sb.Loader(pipe, num_workers=1, max_batches=2, max_bytes=2 * fixed, timeout_s=30)
    monkeypatch.setattr(
        loader_mod, "read_limits", lambda: Limits(1, GIB, available_bytes=400 * MIB)
    )
    with pytest.raises(ValueError, match=f"max_bytes >= {2 * fixed}"):
        sb.Loader(pipe, timeout_s=30)


def test_the_existing_auto_rules_are_kept(tmp_path: Path) -> None:
    lim = Limits(cpus=8, memory_bytes=64 * GIB, cores=8, suggested_workers=8)
    # in order, a given max_batches caps the workers (a batch of credit each)
    assert loader_defaults(lim, max_batches=3).num_workers == 3
    assert loader_defaults(lim, max_batches=3, in_order=False).num_workers == 7
    # a pipeline decoding onto a device runs in this process
    d = loader_defaults(lim, on_device="cuda")
    assert (d.num_workers, d.max_batches) == (0, 2)
    # at most 64 (the shared counters' rows)
    assert loader_defaults(Limits(cpus=256, memory_bytes=1 << 40)).num_workers == 64
    # given values are kept as they are
    d = loader_defaults(lim, num_workers=5, max_batches=6, max_bytes=123)
    assert (d.num_workers, d.max_batches, d.max_bytes, d.auto) == (5, 6, 123, (False,) * 3)
    assert loader_defaults(lim, num_workers=3).max_batches == 12
    assert loader_defaults(lim, num_workers=0).max_batches == 2


@pytest.mark.parametrize(
    "lim",
    [
        Limits(cpus=1.5, memory_bytes=64 * GIB),
        Limits(cpus=2, memory_bytes=4 * GIB),
        Limits(cpus=8, memory_bytes=2 * GIB),
        Limits(cpus=16, memory_bytes=64 * GIB, cores=4, suggested_workers=4),
        Limits(cpus=128, memory_bytes=1 << 40),
    ],
    ids=repr,
)
def test_recommend_agrees_with_the_loader_defaults(lim: Limits) -> None:
    rec, d = recommend(limits=lim), loader_defaults(lim)
    assert (rec.num_workers, rec.max_batches) == (d.num_workers, d.max_batches)


# -- a real Loader ---------------------------------------------------------------------
def test_loader_with_no_arguments_runs_to_the_end_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="streambuf"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        loader = sb.Loader(tiny_pipe(), timeout_s=60)
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert items(loader) == list(range(64))  # every item, once
    assert not [w for w in caught if TORCH_WARNING in str(w.message)]
    lines = defaults_lines(caplog)
    assert len(lines) == 1, lines
    here = loader_defaults(read_limits())
    assert (loader.num_workers, loader.max_batches) == (here.num_workers, here.max_batches)
    assert loader.defaults.auto == (True, True, True)
    assert f"num_workers=auto -> {loader.num_workers} (" in lines[0]
    assert f"max_batches=auto -> {loader.max_batches} (" in lines[0]
    # (25% of what is available, or the floor or ceiling of that: a machine's matter)
    assert "max_bytes=auto -> " in lines[0] and "% of " in lines[0] and " available" in lines[0]


def test_the_processes_of_a_node_share_its_cpus_and_memory() -> None:
    # torchrun starts one process a GPU on the node, each with its own Loader: each
    # takes its share, not every CPU and a quarter of the memory each
    alone = Limits(16, 64 * GIB, cores=16, suggested_workers=16, available_bytes=32 * GIB)
    shared = Limits(
        16, 64 * GIB, cores=16, suggested_workers=16, available_bytes=32 * GIB, local_processes=4
    )
    a, d = loader_defaults(alone), loader_defaults(shared)
    assert (a.num_workers, a.max_bytes) == (15, 8 * GIB)
    assert (d.num_workers, d.max_bytes) == (3, 2 * GIB)  # 16 / 4 CPUs, one for the loop
    assert "shared by 4 processes on this node" in d.reasons[0]
    assert "share of 4 on this node" in d.reasons[2]
    # the memory bound per worker is the process's share too
    small = Limits(16, 8 * GIB, cores=16, suggested_workers=16, local_processes=4)
    assert loader_defaults(small).num_workers == 2  # 512 MiB a worker in half of 2 GiB


def test_the_processes_of_a_node_are_read_from_local_world_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert read_limits().local_processes == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert read_limits().local_processes == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert read_limits().local_processes == 1
    assert read_limits(local_processes=3).local_processes == 3


def test_the_loader_uses_the_limits_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lim = machine(
        tmp_path,
        {"cpu.max": "150000 100000\n", "memory.max": str(4 * GIB), "memory.current": str(GIB)},
    )
    monkeypatch.setattr(loader_mod, "read_limits", lambda: lim)
    with caplog.at_level(logging.INFO, logger="streambuf"):
        loader = sb.Loader(tiny_pipe(), timeout_s=60)
    assert (loader.num_workers, loader.max_batches, loader.max_bytes) == (1, 4, 768 * MIB)
    assert defaults_lines(caplog) == [
        "streambuf.Loader: num_workers=auto -> 1 (1 CPU, by cgroup quota and affinity: 1.5), "
        "max_batches=auto -> 4 (4 per worker), "
        "max_bytes=auto -> 768 MiB (25% of 3.0 GiB available)"
    ]


def test_the_default_stays_within_what_torch_suggests(monkeypatch: pytest.MonkeyPatch) -> None:
    # limits that allow 3 workers by CPU, 1 by torch's count: the DataLoader gets 1, quietly
    lim = Limits(cpus=4, memory_bytes=64 * GIB, suggested_workers=1, available_bytes=8 * GIB)
    monkeypatch.setattr(loader_mod, "read_limits", lambda: lim)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = sb.Loader(tiny_pipe(), timeout_s=60)
        assert items(loader) == list(range(64))
    assert loader.num_workers == 1
    assert not [w for w in caught if TORCH_WARNING in str(w.message)]


def test_explicit_values_still_work_and_pinned_ones_are_not_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_read() -> Limits:
        raise AssertionError("read_limits called with every value given")

    monkeypatch.setattr(loader_mod, "read_limits", no_read)
    with caplog.at_level(logging.INFO, logger="streambuf"):
        loader = sb.Loader(
            tiny_pipe(), num_workers=0, max_batches=3, max_bytes="1MiB", timeout_s=60
        )
        assert items(loader) == list(range(64))
    assert (loader.num_workers, loader.max_batches, loader.max_bytes) == (0, 3, MIB)
    assert loader.defaults.auto == (False, False, False)
    assert defaults_lines(caplog) == []
    # one given, the others auto: the line names the given one as it is
    lim = Limits(cpus=8, memory_bytes=64 * GIB, available_bytes=8 * GIB)
    monkeypatch.setattr(loader_mod, "read_limits", lambda: lim)
    with caplog.at_level(logging.INFO, logger="streambuf"):
        loader = sb.Loader(tiny_pipe(), num_workers=0, timeout_s=60)
    assert (loader.num_workers, loader.max_batches, loader.max_bytes) == (0, 2, 2 * GIB)
    assert defaults_lines(caplog)[-1].startswith("streambuf.Loader: num_workers=0, max_batches=")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("num_workers", -1),
        ("num_workers", "2"),
        ("num_workers", "Auto"),
        ("num_workers", None),
        ("max_batches", 0),
        ("max_batches", "3"),
        ("max_batches", None),
        ("max_bytes", "lots"),
        ("max_bytes", 1.5),
        ("max_bytes", 0),
        ("max_bytes", None),
    ],
)
def test_bad_values_still_raise(option: str, value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=option):
        sb.Loader(tiny_pipe(), **{option: value})
