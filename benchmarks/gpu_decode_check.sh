#!/usr/bin/env bash
# The GPU checks of decoder="cuda" (streambuf/video/gpu.py, docs/video.md "Decoding on
# the GPU"), prepared for a session that is lent a CUDA machine (the H200 of the device
# tool: Python 3.12 with a CUDA torch, no PyAV, nothing fetched there).
#
#   here, in the repo root:  bash benchmarks/gpu_decode_check.sh prepare
#       downloads PyAV, torchdata and psutil wheels for Python 3.12 into .whl/
#       (git-ignored, ~36 MB: the working tree plus them stays under the device tool's
#       64 MiB; benchmarks/device_session.sh prepare)
#   there, through the device tool, with carry=[".whl"] and timeout_s=540:
#       bash benchmarks/gpu_decode_check.sh device
#       1. installs the wheels into /tmp/site;
#       2. says what the machine has (torch, CUDA, PyAV's hwaccels) and whether NVDEC
#          opens a small H.264 file made there (the driver's video libraries must be
#          mounted: NVIDIA_DRIVER_CAPABILITIES with "video");
#       3. runs tests/video/test_gpu_decode.py (the NVDEC end-to-end test runs there);
#       4. runs `streambuf bench video --quick`, which adds the decoder='cuda' rows
#          against the same PyAV seek-per-clip peers (GOP 30 and 250, 720p).
#   Everything it prints is also written under $OUT (pytest.log, bench.log, bench/).
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
prepare)  # the same wheels as the device session's (PyAV, torchdata, psutil)
    exec bash benchmarks/device_session.sh prepare
    ;;
device)
    out="${OUT:-/tmp/gpu-decode-check}"
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
    python3 - <<'EOF' 2>&1 | tee "$out/machine.log"
import io, time
import av, numpy as np, torch
from av.codec.hwaccel import HWAccel, hwdevices_available
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("av", av.__version__, "hwaccels", hwdevices_available())
buf = io.BytesIO()
with av.open(buf, "w", format="mp4") as c:
    s = c.add_stream("libx264", rate=24)
    s.width, s.height, s.pix_fmt = 320, 240, "yuv420p"
    for i in range(24):
        img = np.full((240, 320, 3), i * 10, np.uint8)
        for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
buf.seek(0)
t0 = time.perf_counter()
with av.open(buf, hwaccel=HWAccel("cuda", allow_software_fallback=False, is_hw_owned=True)) as c:
    frames = list(c.decode(video=0))
f = frames[0]
print("NVDEC decoded", len(frames), "frames in", round(time.perf_counter() - t0, 3), "s; format",
      f.format.name, "sw_format", getattr(f.sw_format, "name", None))
planes = [torch.from_dlpack(p.__dlpack__()) for p in f.planes]
print("planes", [(tuple(t.shape), str(t.device)) for t in planes])
EOF
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/video/test_gpu_decode.py \
        2>&1 | tee "$out/pytest.log"
    timeout 300 python3 -m streambuf bench video --quick --out "$out/bench" 2>&1 \
        | tee "$out/bench.log" | grep -v "it/s"
    ;;
*)
    echo "usage: bash benchmarks/gpu_decode_check.sh prepare|device" >&2
    exit 2
    ;;
esac
