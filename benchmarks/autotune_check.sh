#!/usr/bin/env bash
# Issue 26's targets where the CPUs are not the limit: threads="auto" on a machine with
# more cores than the 2-core VM the project is built on (the device tool's machine: 16
# cores, Python 3.12 with torch, nothing fetched there). On 2 cores the 4 workers of
# the seed workload saturate the CPUs before any thread count is both >= 1.3x
# torchdata.nodes 32 threads and >= 0.95 of `threads / latency` (docs/design.md, "Fast
# and efficient at once?"), and the busy-CPU rule holds the mixed row at 4 threads a
# worker; with 16 cores neither bound is there, so this is where both are measured.
#
#   here, in the repo root:  bash benchmarks/autotune_check.sh prepare
#       downloads the torchdata, psutil and numpy wheels for Python 3.12 into .whl/
#       (git-ignored, ~17 MB: well under the device tool's 64 MiB)
#   there, through the device tool, with carry=[".whl"] and timeout_s=570 (steps 3-5
#   stop at 180, 180 and 120 s):
#       bash benchmarks/autotune_check.sh device
#       1. installs the wheels into /tmp/site (numpy only where torch came without it);
#       2. says what the machine has (cores, CPU quota, torch);
#       3. the seed curve: fixed 8, 16, 32 threads a worker, "auto" and torchdata.nodes
#          32 threads, 2 rounds (benchmarks/auto_threads_curve.py): is there a count at
#          >= 1.3x the peer and >= 0.95 efficiency, and does "auto" reach it;
#       4. the mixed row: fixed 4, 8, 16 a worker against "auto", 3 rounds
#          (benchmarks/auto_vs_fixed.py --section mixed): "auto" >= the best fixed count;
#       5. the CPU-bound row: "auto" against threads=1, 3 rounds (--section cpu): with 16
#          cores the busy-CPU rule does not fire, so the climb alone must keep it low.
#   Everything it prints is also written under $OUT (machine.log, curve.log, mixed.log,
#   cpu.log). `bash benchmarks/autotune_check.sh smoke` runs steps 2-5 in their tiny
#   modes here (seconds; what the smoke test runs).
set -uo pipefail
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.."

run_checks() {  # $1: "full" or "tiny"; $2: the folder for the logs
    local out="$2" tiny=() rc=0
    [ "$1" = tiny ] && tiny=(--tiny)
    mkdir -p "$out"
    "$PY" - <<'EOF' 2>&1 | tee "$out/machine.log"
import os, platform, torch
from streambuf.resources import cpu_limit
print("python", platform.python_version(), "torch", torch.__version__)
print("cores", os.cpu_count(), "affinity", len(os.sched_getaffinity(0)), "cpu_limit", cpu_limit())
EOF
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    timeout 180 "$PY" benchmarks/auto_threads_curve.py "${tiny[@]}" --counts 8 16 32 \
        --rounds 2 2>&1 | tee "$out/curve.log" | grep -v "it/s" || rc=1
    timeout 180 "$PY" benchmarks/auto_vs_fixed.py "${tiny[@]}" --section mixed \
        --fixed 4 8 16 --rounds 3 2>&1 | tee "$out/mixed.log" | grep -v "it/s" || rc=1
    timeout 120 "$PY" benchmarks/auto_vs_fixed.py "${tiny[@]}" --section cpu --rounds 3 \
        2>&1 | tee "$out/cpu.log" | grep -v "it/s" || rc=1
    return $rc
}

case "${1:-}" in
prepare)
    mkdir -p .whl
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl torchdata==0.11.0 psutil==7.2.2 numpy==2.4.6
    ls -la .whl
    ;;
device)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/torchdata-*.whl .whl/psutil-*.whl || exit 1
    if ! python3 -c "import numpy" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target /tmp/site .whl/numpy-*.whl || exit 1
    fi
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
    run_checks full "${OUT:-/tmp/autotune-check}"
    ;;
smoke)
    export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
    run_checks tiny "${OUT:-/tmp/autotune-check-smoke}"
    ;;
*)
    echo "usage: bash benchmarks/autotune_check.sh prepare|device|smoke" >&2
    exit 2
    ;;
esac
