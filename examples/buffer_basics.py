"""The README's building-blocks example: a byte-bounded buffer and background prefetch.

python examples/buffer_basics.py
"""

from __future__ import annotations

import threading

import torch

import streambuf as sb


def main() -> None:
    # A thread-safe FIFO bounded by items AND bytes.
    buf: sb.BoundedBuffer[torch.Tensor] = sb.BoundedBuffer(max_items=8, max_bytes="64MiB")

    def produce() -> None:
        for i in range(100):
            buf.put(torch.full((1024, 1024), i, dtype=torch.uint8))  # 1 MiB; blocks when full
        buf.close()  # consumers drain what is left, then stop

    producer = threading.Thread(target=produce)
    producer.start()
    total = sum(int(t[0, 0]) for t in buf)
    producer.join(timeout=10)
    stats = buf.stats()
    print(f"sum={total} peak_items={stats.peak_items} peak_bytes={stats.peak_bytes}")
    assert total == sum(range(100)) and stats.peak_bytes <= 64 << 20

    # Background prefetch on 4 threads, in source order, bounded in bytes.
    def load(i: int) -> torch.Tensor:
        return torch.zeros(256, 256) + i

    firsts = [
        int(x[0, 0])
        for x in sb.prefetch(range(32), max_items=8, max_bytes="16MiB", threads=4, fn=load)
    ]
    assert firsts == list(range(32))
    print("prefetch delivered", len(firsts), "items in order")


if __name__ == "__main__":
    main()
