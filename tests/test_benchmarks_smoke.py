"""Each benchmark, run tiny: it must finish, deliver every sample, keep streambuf's credits
within its budget, compare against its peers, and write its JSON (and PNG).

Benchmarks are not tests of performance (tiny sizes measure nothing); these prove they
run and report what they claim. Network and video: test_bench_network_smoke.py and
test_bench_video_smoke.py.
"""

from __future__ import annotations

import sys

import pytest
import torch

from streambuf.bench import all as bench_all
from streambuf.bench import buffer, bursty, gpu, latency, memory, mixed, nodes, stall
from streambuf.bench._deps import importable, require
from streambuf.bench._report import Headline, check_runs, credit_bound
from streambuf.cli import main
from tests.bench_checks import assert_delivered, assert_headline, saved

pytestmark = pytest.mark.timeout(300)


def test_latency_has_every_peer_and_the_zero_latency_rows(tmp_path):
    report = latency.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    assert_headline(report)
    data = saved(tmp_path, "latency")
    kinds = {(r["kind"], r["config"]["latency_s"] > 0) for r in data["rows"]}
    assert kinds == {
        (k, lat) for k in ("dataloader", "torchdata", "streambuf") for lat in (True, False)
    }
    tdn = [r for r in data["rows"] if r["kind"] == "torchdata"]
    sb = next(r for r in data["rows"] if r["kind"] == "streambuf")
    # equal total threads: torchdata.nodes gets workers x threads in one process
    assert tdn[0]["config"]["threads"] == sb["config"]["workers"] * sb["config"]["threads"]
    assert all(
        r["config"]["pin_memory"] and r["config"]["persistent_workers"] for r in data["rows"]
    )
    assert {h["workload"] for h in data["headline"]} == {
        "latency seed (10 ms/sample)",
        "latency seed (0 ms/sample)",
        "latency seed (10 ms/sample), threads='auto'",
    }
    auto = [r for r in data["rows"] if r["config"].get("threads") == "auto"]
    assert len(auto) == 1 and auto[0]["runs"][0]["threads_over_time"], auto
    # the auto headline says which count it chose and when it settled
    h = next(h for h in data["headline"] if "auto" in h["workload"])
    assert "chose" in h["how"] and "reached at" in h["how"]
    assert (tmp_path / "latency.png").stat().st_size > 0


def test_nodes_compares_both_graphs_within_streambufs_bounds(tmp_path):
    report = nodes.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    assert_headline(report)
    data = saved(tmp_path, "nodes")
    keys = {(r["kind"], r["config"]["size"], r["config"]["consumer"]) for r in data["rows"]}
    assert keys == {
        (k, size, c)
        for k in ("torchdata", "streambuf")
        for size in ("1MiB", "64KiB")
        for c in ("steady", "hiccups")
    }
    for r in data["rows"]:
        run = r["runs"][0]
        assert run["peak_live_bytes"] >= r["config"]["item_bytes"]
        if r["kind"] == "streambuf":  # each node within its own byte bound
            assert 0 < run["mapper_peak_bytes"] <= run["mapper_max_bytes"]
            assert 0 < run["prefetcher_peak_bytes"] <= run["prefetcher_max_bytes"]
    assert {h["metric"] for h in data["headline"]} == {"items/s", "peak live MiB"}


def test_mixed_compares_processes_x_threads_with_each_alone(tmp_path):
    report = mixed.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    assert_headline(report)
    assert {r["kind"] for r in report["rows"]} == {"dataloader", "torchdata", "streambuf"}
    assert report["cpu_iters"] > 0
    assert all(r["config"]["cpu_iters"] == report["cpu_iters"] for r in report["rows"])
    data = saved(tmp_path, "mixed")
    workloads = [h["workload"] for h in data["headline"]]
    assert "mixed, threads='auto'" in workloads, workloads
    names = {r["name"] for r in data["rows"]}
    assert {"cpu-bound: streambuf 2x1 thread", "cpu-bound: streambuf 2x auto threads"} <= names


@pytest.mark.parametrize("mod", [memory, stall, bursty], ids=lambda m: m.__name__.split(".")[-1])
def test_ladder_benchmarks_run_tiny(mod, tmp_path, capsys):
    report = mod.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    if report["benchmark"] != "bursty":  # an ablation: no peer, no headline
        assert_headline(report)
    saved(tmp_path, report["benchmark"])
    assert "| run |" in capsys.readouterr().out
    if report["benchmark"] == "memory":
        assert (tmp_path / "memory.png").stat().st_size > 0
        assert all(
            r["runs"][0]["growth_bytes"] == r["runs"][0]["growth_bytes"] for r in report["rows"]
        )


def test_buffer_benchmark_and_its_headline(tmp_path):
    report = buffer.run(out=str(tmp_path), tiny=True)
    assert set(report["results"]) == {"ints", "tensors_4KiB", "ints_get_many"}
    assert_headline(report)
    assert saved(tmp_path, "buffer")["results"]["ints"]["items"] == 5_000
    many = report["results"]["ints_get_many"]  # the references it is read against
    assert many["lean_median"] > 0 and many["ceiling_items_per_s"] > 0
    assert "nothing sized or counted" in report["headline"][-1]["how"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
def test_gpu_benchmark_fails_fast_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match=r"no CUDA device.*--allow-cpu"):
        gpu.run(out=str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing was generated or written


def test_bench_all_prints_one_headline_table(tmp_path, capsys):
    report = bench_all.run(out=str(tmp_path), tiny=True, names=("buffer", "gpu"))
    out = capsys.readouterr().out
    assert "## Headline" in out and "| workload | metric | streambuf | strongest peer |" in out
    assert [h["workload"] for h in report["headline"]] == [
        "buffer hand-over (ints)",
        "buffer hand-over (tensors_4KiB)",
        "buffer hand-over (ints_get_many)",
    ]
    if not torch.cuda.is_available():
        assert "gpu" in report["skipped"]
    assert (tmp_path / "headline.md").read_text().startswith("| workload |")
    assert saved(tmp_path, "headline")["errors"] == {}


def test_headline_ratio_and_losses():
    win = Headline("w", "batches/s", "higher", streambuf=30.0, peer=10.0, peer_name="DataLoader")
    loss = Headline("w", "growth MiB", "lower", streambuf=200.0, peer=100.0, peer_name="pf=1")
    assert win.ratio == 3.0 and loss.ratio == 0.5


def test_check_runs_names_lost_samples_and_overspent_credits():
    rows = [
        {"name": "a", "runs": [{"samples": 31, "expected_samples": 32}]},
        {"name": "b", "runs": [{"peak_in_flight_bytes": 11, "budget_max_bytes": 10}]},
    ]
    with pytest.raises(RuntimeError, match=r"a run 0: delivered 31.*\n.*b run 0: peak credits 11"):
        check_runs(rows)


def test_credit_bound_allows_one_oversize_batch_per_worker_and_no_more():
    # 64 MiB budget: 48 MiB of credits, 24 MiB per worker, 32 MiB batches (each one
    # oversize, admitted alone): 2 x 32 MiB is the rule; one byte more is a bug
    mib = 1 << 20
    run = {
        "budget_max_bytes": 48 * mib,
        "per_worker_limit_bytes": [24 * mib, 24 * mib],
        "batch_bytes": 32 * mib,
        "oversize": 5,
        "peak_in_flight_bytes": 64 * mib,
    }
    assert credit_bound(run) == 64 * mib
    check_runs([{"name": "ok", "runs": [run]}])
    with pytest.raises(RuntimeError, match="peak credits"):
        check_runs([{"name": "over", "runs": [dict(run, peak_in_flight_bytes=64 * mib + 1)]}])
    with pytest.raises(RuntimeError, match="peak credits"):  # no oversize: the limit itself
        check_runs([{"name": "strict", "runs": [dict(run, oversize=0)]}])


def test_optional_peers_are_named_with_the_extra():
    with pytest.raises(ImportError, match=r"streambuf\[bench\]"):
        require("streambuf_no_such_peer", purpose="a test")
    assert importable("streambuf_no_such_peer").startswith("not importable: ModuleNotFoundError")
    assert importable("json") is None


def test_cli_bench_buffer_and_help(tmp_path, capsys):
    assert main(["bench", "buffer", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "buffer.json").exists()
    with pytest.raises(SystemExit) as exc:
        main(["bench", "gpu", "--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert "GPU busy fraction" in help_text and "--allow-cpu" in help_text


def test_a_missing_matplotlib_skips_the_plot_and_names_the_extra(tmp_path, monkeypatch, capsys):
    from streambuf.bench._report import Ladder

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rows = [
        {"name": "DataLoader pf=1", "kind": "dataloader", "config": {"prefetch_factor": 1}},
        {"name": "streambuf", "kind": "streambuf", "config": {}},
    ]
    path = Ladder("t", [dict(r, batches_per_s=1.0) for r in rows]).draw(str(tmp_path), "x")
    assert path is None and not (tmp_path / "x.png").exists()
    assert "streambuf[bench]" in capsys.readouterr().out


def test_resume_and_scale_benchmarks_run_tiny(tmp_path):
    from streambuf.bench import resume, scale

    r = resume.run(out=str(tmp_path), tiny=True)
    assert r["state_dict"]["state_bytes"] > 0 and r["state_dict"]["median_s"] < 0.1
    assert r["resume"]["resume_median_s"] > 0 and r["resume"]["fresh_median_s"] > 0
    assert saved(tmp_path, "resume")["headline"]
    s = scale.run(out=str(tmp_path), tiny=True)
    assert s["list"]["batches"] == s["strlist"]["batches"] == 2 * -(-10_000 // 256)
    assert saved(tmp_path, "scale")["headline"]


def test_strlist_is_a_compact_read_only_sequence():
    import pickle

    from streambuf._compact import StrList

    items = ["s3://b/a-0.tar", "héllo", "", "x" * 300]
    s = StrList(items)
    assert list(s) == items and len(s) == 4 and s[-1] == items[-1] and s[1:3] == items[1:3]
    assert pickle.loads(pickle.dumps(s)) == items
    with pytest.raises(IndexError):
        s[4]


def test_handoff_profile_runs_tiny(capsys):
    from streambuf.bench import _handoff_profile

    out = _handoff_profile.main(["--batches", "2"])
    assert set(out) >= {"plain fetch + default_collate", "streambuf map(threads=8)"}
    assert all(a > 0 and b > 0 for a, b in out.values())
    assert "cProfile" in capsys.readouterr().out


def test_chunk_probe_runs_tiny(capsys):
    from streambuf.bench import _chunk_probe

    out = _chunk_probe.main(["--shards", "2", "--per-shard", "3", "--lanes", "2"])
    assert out["inline, 2 lane(s)"] > 0 and out["threads, 2 lane(s), chunk 16"] > 0
    assert 0 < out["ledger us/sample"] < 1000
    assert "samples/s, best of 3" in capsys.readouterr().out


def test_tar_profile_runs_tiny(capsys):
    from streambuf.bench import _tar_profile

    out = _tar_profile.main(["--shards", "2", "--per-shard", "3"])
    assert out["streambuf shards(lanes=1, adaptive=False)"] > 0
    assert out["parser alone: streambuf iter_tar_records"] > 0
    assert "cProfile" in capsys.readouterr().out
