import json, subprocess, sys
cfg = {"runner": "streambuf.bench.workloads:run_loader", "workload": "seed", "shape": [3, 224, 224], "latency_s": 0.01, "batch_size": 32, "batches": 480, "workers": 4, "pin_memory": True, "persistent_workers": True, "kind": "streambuf", "threads": "auto", "max_batches": 8, "max_bytes": 205520896, "name": "seed auto"}
if len(sys.argv) > 1 and sys.argv[1] == "workload":
    import os
    cfg.update(json.loads(sys.argv[3]))
    if sys.argv[2] == "plain":
        import streambuf._tuner as t
        t.ThreadTuner._refine = lambda self, c, n: None  # the run without bisection
    from streambuf.bench.workloads import run_loader
    r = run_loader(cfg)
    print(json.dumps({k: r.get(k) for k in ("batches_per_s", "threads_chosen", "settled_batches_per_s", "efficiency")}))
    raise SystemExit
extra = sys.argv[1] if len(sys.argv) > 1 else "{}"
for i in range(3):
    for mode in ("refine", "plain"):
        out = subprocess.run([sys.executable, __file__, "workload", mode, extra], capture_output=True, text=True, timeout=300)
        print(mode, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:], flush=True)
