"""The scripts in benchmarks/ (what a user runs directly) work: the prefetch_factor
ladder and the GPU run's CPU stand-in run tiny; the README-table script passes its
choices to ``streambuf bench all`` and refuses an unknown benchmark by name."""

from __future__ import annotations

import difflib
import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_checks import assert_delivered, assert_headline, saved

pytestmark = pytest.mark.timeout(180)
SCRIPTS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_prefetch_ladder_runs_tiny(capsys):
    rows = _script("prefetch_ladder").main(["--tiny"])
    names = [r["loader"] for r in rows]
    assert names[:2] == ["DataLoader(prefetch_factor=1)", "DataLoader(prefetch_factor=4)"]
    assert names[-1].startswith("streambuf Loader")
    assert all(r["batches"] == 4 and r["batches_per_s"] > 0 for r in rows)  # 2 workers x 2
    assert "batches/s" in capsys.readouterr().out


def test_the_gpu_script_runs_its_cpu_stand_in(tmp_path):
    report = _script("gpu").main(["--allow-cpu", "--tiny", "--out", str(tmp_path)])
    assert_delivered(report)
    assert_headline(report)
    assert {r["config"]["part"] for r in report["rows"]} == {"seed", "video"}
    assert all(0 < r["busy_fraction"] <= 1.0 for r in report["rows"])
    assert saved(tmp_path, "gpu")["device"] in ("cpu", "cuda")


def test_the_readme_table_script_passes_its_choices(monkeypatch, tmp_path):
    mod = _script("readme_table")
    seen = {}
    monkeypatch.setattr(mod.bench_all, "run", lambda **kw: seen.update(kw) or {"rows": []})
    mod.main(["--quick", "--only", "latency", "network", "--out", str(tmp_path)])
    assert seen == {
        "quick": True,
        "tiny": False,
        "out": str(tmp_path),
        "names": ("latency", "network"),
    }
    with pytest.raises(SystemExit):
        mod.main(["--only", "no-such-bench"])


def test_the_module_count_script_sees_the_tar_path(capsys):
    out = _script("modules_on_path").main()
    assert {"sources/tar.py", "wds/decoders.py", "stages.py", "loader.py"} <= set(out[0])
    assert "_transport.py" in out[2] and "in process:" in capsys.readouterr().out


def test_the_packing_benchmark_runs_tiny(capsys):
    rows = _script("pack_tokens").main(["--tiny"])
    assert [r["reader"].split(":")[0] for r in rows] == ["tar shards"] * 2 + ["flat files"] * 2
    assert all(r["blocks"] > 0 and r["blocks_per_s"] > 0 for r in rows)
    # the two flat-file readers deliver the same number of whole blocks
    assert rows[2]["blocks"] == rows[3]["blocks"]
    assert "blocks/s" in capsys.readouterr().out


def test_the_stage_stats_overhead_script_runs_tiny(capsys):
    out = _script("stage_stats_overhead").main(["--pairs", "1", "--mode", "tiny"])
    assert out and all(len(r["on"]) == len(r["off"]) == 1 for r in out.values())
    assert all(r["median_pair_ratio"] > 0 for r in out.values())
    assert "median of pair ratios" in capsys.readouterr().out


def test_the_gpu_decode_check_script_parses_and_names_its_modes():
    """benchmarks/gpu_decode_check.sh runs only on a CUDA machine (device mode) or
    downloads wheels (prepare): here, its syntax and its usage line."""
    import subprocess

    script = SCRIPTS / "gpu_decode_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    got = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert got.returncode == 2 and "prepare|device" in got.stderr


def test_the_device_session_script_runs_its_steps_tiny(tmp_path):
    """benchmarks/device_session.sh's device mode runs, in one call on a GPU machine,
    the buffer benchmark, the autotuning checks, the GPU benchmark and the NVDEC test; its
    smoke mode runs the same commands in their tiny modes here (the GPU benchmark on its
    CPU stand-in), under the same step caps and the same 8-file output."""
    import os
    import subprocess
    import sys

    script = SCRIPTS / "device_session.sh"
    got = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert got.returncode == 2 and "prepare|device|smoke" in got.stderr
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    done = subprocess.run(
        ["bash", str(script), "smoke"], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "skipped" not in done.stdout.split("== nvdec")[0]  # every step ran
    assert "cpu_limit" in (tmp_path / "machine.log").read_text()
    assert "streambuf auto" in (tmp_path / "curve.log").read_text()
    assert "ints_get_many" in (tmp_path / "buffer.log").read_text()
    assert "busy %" in (tmp_path / "gpu.log").read_text()
    assert " passed" in (tmp_path / "nvdec.log").read_text()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 8 and "results.tgz" in files, files  # what comes back from the GPU machine


def test_the_auto_threads_curve_runs_tiny(capsys):
    rows = _script("auto_threads_curve").main(["--tiny"])
    assert [r["run"] for r in rows] == [
        "torchdata 8",  # the tiny latency rows: 2 workers x 4 threads
        "streambuf 1",
        "streambuf 2",
        "streambuf auto",
    ]
    assert rows[1]["threads"] == 2 and rows[2]["threads"] == 4  # per worker x 2 workers
    assert all(r["batches_per_s"] > 0 for r in rows)
    # (the "auto" row's count is sampled every 8 batches: a tiny run may have none)
    assert all(r["efficiency"] > 0 for r in rows[:3])
    assert rows[1]["x_peer"] == rows[1]["batches_per_s"] / rows[0]["batches_per_s"]
    assert "efficiency" in capsys.readouterr().out


def test_the_auto_threads_curve_adds_rows_at_larger_budgets():
    rows = _script("auto_threads_curve").main(
        ["--tiny", "--budgets", "1", "3", "--items-per-thread", "1"]
    )
    names = [r["run"] for r in rows]
    assert names[5:8] == [
        "streambuf 1, 1 a thread",
        "streambuf 2, 1 a thread",
        "streambuf auto, 1 a thread",
    ]
    assert names[1:5] == [
        "streambuf 1",
        "streambuf 2",
        "streambuf 1, budget x3",
        "streambuf 2, budget x3",
    ]
    by = {r["run"]: r for r in rows}
    assert by["streambuf 2, budget x3"]["threads"] == by["streambuf 2"]["threads"] == 4
    assert by["streambuf 1, budget x3"]["batches_per_s"] > 0
    assert by["streambuf 1, budget x3"]["max_bytes"] == 3 * by["streambuf 1"]["max_bytes"] > 0
    assert by["streambuf 2, 1 a thread"]["map_peak_items"] > 0  # the stage's stats came back


def test_the_read_charge_script_runs_tiny(capsys):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    rows = _script("read_charge").main(["--tiny"])
    assert [r["lanes"] for r in rows] == [3, "auto"]
    assert all(r["samples"] == 32 and r["samples_per_s"] > 0 for r in rows)
    # 16 MiB over 2 workers: half is 4 MiB a worker, below the reads as set (4 shards
    # over 2 workers: 2 lanes of 2 blocks, 1 MiB readahead and 8 MiB requests = 22 MiB)
    assert [r["charge_mib_a_worker"] for r in rows] == [4.0, 4.0]
    assert [r["reads_as_set_mib_a_worker"] for r in rows] == [22.0, 22.0]
    assert "over moto" in capsys.readouterr().out


def test_the_benchmark_loader_takes_the_maps_depth_from_its_config():
    from streambuf.bench.workloads import _BUILDERS, SampleMaker

    cfg = {"threads": 3, "batch_size": 2, "workers": 0, "max_batches": 2, "max_bytes": 1 << 20}
    for given, want in ((None, None), (5, 5)):
        built = _BUILDERS["streambuf"](dict(cfg, map_max_items=given), 4, SampleMaker())
        try:
            maps = [s for s in built.loader.pipeline._stages if type(s).__name__ == "Map"]
            assert [m.max_items for m in maps] == [want]
        finally:
            built.close()


def test_the_auto_vs_fixed_script_runs_tiny(capsys):
    script = _script("auto_vs_fixed")
    rows = script.main(["--tiny"])
    assert [r["run"].split(": ")[1] for r in rows] == [
        "streambuf 2x1 thread",
        "streambuf 2x auto threads",
        "streambuf 2x auto threads, adaptive=False",
    ]
    assert all(r["batches_per_s"] > 0 and len(r["runs"]) == 1 for r in rows)
    assert rows[1]["x_ref"] == rows[1]["runs"][0] / rows[0]["runs"][0]  # against threads=1
    assert "x threads=1" in capsys.readouterr().out
    # the mixed section: the fixed count (the tiny mode's), then auto, against the fixed
    # with --workers 1 (the CPUs half idle, as on a machine with more cores)
    rows = script.main(["--tiny", "--section", "mixed", "--workers", "1"])
    assert [r["run"] for r in rows] == ["streambuf 1x4 threads", "streambuf 1x auto threads"]
    assert rows[1]["ref"] == "streambuf 1x4 threads"
    assert rows[1]["x_ref"] == rows[1]["runs"][0] / rows[0]["runs"][0]
    assert "x the best fixed (streambuf 1x4 threads)" in capsys.readouterr().out


@pytest.mark.skipif(not (SCRIPTS.parent / ".git").exists(), reason="needs a git checkout")
def test_the_ab_revisions_script_runs_tiny(capsys):
    script = _script("ab_revisions")
    got = script.main(
        ["--base", "HEAD", "--bench", "mixed", "--tiny", "--ref", "streambuf 2x4 threads"]
    )
    (name, row), *more = got["rows"].items()
    assert not more and name.startswith("cpu-bound:")  # the last row by default
    assert len(row["base"]) == len(row["new"]) == 1 and row["base"][0] > 0 < row["new"][0]
    assert row["new_over_base"] == row["new"][0] / row["base"][0]
    assert "streambuf 2x4 threads" in capsys.readouterr().out
    # its worktrees are gone
    out = subprocess.run(
        ["git", "-C", str(SCRIPTS.parent), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert "streambuf-ab-" not in out
    with pytest.raises(SystemExit, match="no such row"):
        script.main(["--base", "HEAD", "--bench", "mixed", "--tiny", "--rows", "nope"])


@pytest.mark.skipif(not (SCRIPTS.parent / ".git").exists(), reason="needs a git checkout")
def test_the_ab_revisions_script_measures_a_patch_and_refuses_one_that_does_not_apply(
    tmp_path, capsys
):
    script = _script("ab_revisions")
    # a variant of today's code (a patch kept with an old result stops applying once the
    # code it patched moves): the climb starting at 8 threads
    path = "streambuf/_tuner.py"
    src = (SCRIPTS.parent / path).read_text()
    start = "START_THREADS = 4  # where a climb begins"
    assert src.count(start) == 1
    patch = tmp_path / "start8.patch"
    patch.write_text(
        "".join(
            difflib.unified_diff(
                src.splitlines(keepends=True),
                src.replace(start, start.replace("4", "8")).splitlines(keepends=True),
                f"a/{path}",
                f"b/{path}",
            )
        )
    )
    args = ["--base", "HEAD", "--bench", "mixed", "--tiny", "--rows", "streambuf 2x auto threads"]
    got = script.main([*args, "--patch", str(patch)])
    assert got["new"] == f"HEAD + {patch}"
    assert got["rows"]["streambuf 2x auto threads"]["new"][0] > 0
    assert f"new HEAD + {patch}" in capsys.readouterr().out
    bad = tmp_path / "bad.patch"
    bad.write_text(patch.read_text().replace("START_THREADS = 4", "START_THREADS = 5"))
    with pytest.raises(SystemExit, match=r"bad\.patch does not apply to the new revision"):
        script.main([*args, "--patch", str(bad)])
    out = subprocess.run(
        ["git", "-C", str(SCRIPTS.parent), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert "streambuf-ab-" not in out


def test_the_disk_rounds_script_runs_tiny(capsys):
    out = _script("disk_rounds").main(["--tiny"])
    assert out["rounds"] == 1 and out["batch"] == 32
    assert set(out["rates"]) == {
        "streambuf lanes=3",
        "webdataset per sample",
        "webdataset batched",
    }
    ours = out["rates"]["streambuf lanes=3"][0]
    assert out["webdataset per sample"] == ours / out["rates"]["webdataset per sample"][0]
    assert "median" in capsys.readouterr().out
    cpu = out["cpu_us_per_sample"]
    assert set(cpu) == set(out["rates"]) and all(v[0] > 0 for v in cpu.values()), cpu


def test_the_tuner_trace_script_runs_tiny(capsys):
    from streambuf._tuner import ThreadTuner

    before = (ThreadTuner._set, ThreadTuner._choose)
    got = _script("trace_tuner").main(["--tiny", "--batches", "40"])
    # the recording is undone (a later Loader in this process writes nothing)
    assert (ThreadTuner._set, ThreadTuner._choose) == before
    assert got["row"] == "streambuf 2x auto threads"
    assert got["report"]["samples"] == got["report"]["expected_samples"]
    # worker 0 (at least) made a decision, with what it measured
    lines = [line for trace in got["traces"].values() for line in trace]
    assert any("kept" in line and "noise" in line for line in lines), got["traces"]
    assert "batches/s" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such row"):
        _script("trace_tuner").main(["--tiny", "--row", "nope"])


def test_the_auto_threads_curve_reads_the_tail_of_longer_runs(capsys):
    """``--length 2 --tail``: every run (the peer's too) twice the batches, each read over
    its last three quarters; the "auto" row's count is the mean over that span."""
    rows = _script("auto_threads_curve").main(["--tiny", "--length", "3", "--tail"])
    assert [r["run"] for r in rows][:3] == ["torchdata 8", "streambuf 1", "streambuf 2"]
    assert all(r["batches_per_s"] > 0 for r in rows)
    assert "3x the batches, the last 3/4 of each run" in capsys.readouterr().out


def test_a_loader_run_reports_its_tail_rate():
    from streambuf.bench import latency
    from streambuf.bench.workloads import run_loader

    cfg = next(
        c
        for c in latency.configs("tiny")
        if c["workload"] == "seed" and c["kind"] == "streambuf" and c["threads"] == "auto"
    )
    report = run_loader(dict(cfg, batches=40))
    assert report["batches"] == 40
    # the last 30 of 40 batches' rate: 29 intervals over the span from batch 11 to the last
    assert 0 < report["tail_batches_per_s"] < 10 * report["batches_per_s"]
    assert report["tail_threads"] >= 1  # the count, sampled every 8 batches, in that span


@pytest.mark.serial  # (it starts a spinning process: not beside the parallel tests)
def test_the_busy_defaults_benchmark_runs_tiny(capsys):
    """Every row (the defaults' ``from_dataset`` + bare ``Loader`` among them) delivers
    its batches at each load, spinners included (a tiny run measures nothing)."""
    report = _script("busy_defaults").main(["--tiny", "--repeats", "1", "--loads", "0", "1"])
    rows = report["rows"]
    assert {r["load"] for r in rows} == {0, 1}
    names = {r["row"] for r in rows}
    assert "seed: streambuf defaults (from_dataset)" in names and len(names) == 5
    for r in rows:
        (run,) = r["runs"]
        assert run["samples"] == run["expected_samples"] and run["batches_per_s"] > 0, r
    out = capsys.readouterr().out
    assert "defaults / DataLoader pf=2" in out
