#!/usr/bin/env bash
# Everything this project measures on the device tool's machine (one H200, 16 cores,
# Python 3.12 with a CUDA torch, no PyAV or torchdata, nothing fetched there), in ONE call:
# a session is lent about 15 minutes of that machine, its start included, so the checks
# run in order of what is still open and each gets a time cap that the call's budget
# shrinks (a step with under 20 s left is skipped and says so).
#
#   here, in the repo root:  bash benchmarks/device_session.sh prepare
#       downloads the PyAV, torchdata and psutil wheels for Python 3.12 into .whl/
#       (git-ignored, ~36 MB: with the tree well under the device tool's 64 MiB)
#   there, through the device tool, carry=[".whl"], timeout_s = BUDGET_S + 30:
#       BUDGET_S=540 bash benchmarks/device_session.sh device
#       1. installs the wheels into /tmp/site; says what the machine has;
#       2. `streambuf bench buffer` (issue 25: get_many >= 3x queue.Queue, where a thread
#          ping-pong is not the 2-core VM's 58 us);
#       3. issue 26 where the CPUs are not the limit: the seed curve at 8, 16, 32
#          threads a worker beside "auto" and torchdata.nodes 32 threads; the mixed
#          ladder 4, 8, 16 against "auto"; the CPU-bound row against threads=1;
#       4. `streambuf bench gpu --quick`: GPU busy fraction and samples/s of real
#          training steps fed by the DataLoader prefetch_factor ladder and by
#          Loader(device="cuda") (seed workload -> ResNet-18-like; video -> 3-D conv);
#       5. tests/video/test_gpu_decode.py, where its NVDEC end-to-end test runs.
#   Each step's output is written under $OUT (<step>.log; the benchmarks' JSON in
#   results.tgz).
#   `bash benchmarks/device_session.sh smoke` runs steps 2-5 in their tiny modes here.
#   Its run of 2026-12-04 (docs/results/h200/) took 17 / 74 / 131 / >70 (cut; 92 alone) /
#   35 / 13 s for steps 2-5 after a 50-90 s start: the caps below leave room for each.
set -uo pipefail
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.."

run_steps() {  # $1: "full" or "tiny"; $2: the folder for the logs
    local mode="$1" out="$2" rc=0 tiny=() gpu=(--quick) buffer="quick=False"
    local start budget
    start=$(date +%s)
    budget="${BUDGET_S:-540}"
    if [ "$mode" = tiny ]; then tiny=(--tiny); gpu=(--tiny --allow-cpu); buffer="tiny=True"; fi
    mkdir -p "$out"
    step() {  # step NAME CAP_S COMMAND...: runs it for min(CAP_S, what is left - 5) s
        local name="$1" cap="$2" left t code t0
        shift 2
        left=$((budget - ($(date +%s) - start)))
        t=$((cap < left - 5 ? cap : left - 5))
        if [ "$t" -lt 20 ]; then
            echo "== $name: skipped, $left s of the budget left" | tee "$out/$name.log"
            rc=1
            return
        fi
        echo "== $name (at most $t s)"
        t0=$(date +%s)
        timeout "$t" "$@" > "$out/$name.log" 2>&1
        code=$?
        grep -v "it/s" "$out/$name.log" | tail -25
        echo "== $name: exit $code after $(($(date +%s) - t0)) s"
        [ "$code" = 0 ] || rc=1
    }
    "$PY" - <<'EOF' 2>&1 | tee "$out/machine.log"
import os, platform, torch
from streambuf.resources import cpu_limit
print("python", platform.python_version(), "torch", torch.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))
print("cores", os.cpu_count(), "affinity", len(os.sched_getaffinity(0)), "cpu_limit", cpu_limit())
EOF
    step buffer 40 "$PY" -c "from streambuf.bench import buffer; buffer.run($buffer, out='$out')"
    step curve 120 "$PY" benchmarks/auto_threads_curve.py "${tiny[@]}" --counts 8 16 32 --rounds 2
    step mixed 140 "$PY" benchmarks/auto_vs_fixed.py "${tiny[@]}" --section mixed \
        --fixed 4 8 16 --rounds 3
    step cpu 110 "$PY" benchmarks/auto_vs_fixed.py "${tiny[@]}" --section cpu --rounds 3
    step gpu 240 "$PY" benchmarks/gpu.py "${gpu[@]}" --out "$out"
    step nvdec 60 "$PY" -m pytest -q -p no:cacheprovider tests/video/test_gpu_decode.py
    # the device tool brings back 8 files at most: the benchmarks' JSON travel as one
    (cd "$out" && tar czf results.tgz ./*.json && rm -f ./*.json)
    return $rc
}

case "${1:-}" in
prepare)
    mkdir -p .whl
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        av==18.1.0 torchdata==0.11.0 psutil==7.2.2
    ls -la .whl
    ;;
device)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/av-*.whl .whl/torchdata-*.whl .whl/psutil-*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
    run_steps full "${OUT:-/tmp/device-session}"
    ;;
smoke)
    export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
    run_steps tiny "${OUT:-/tmp/device-session-smoke}"
    ;;
*)
    echo "usage: bash benchmarks/device_session.sh prepare|device|smoke" >&2
    exit 2
    ;;
esac
