"""Entry point of a benchmark child process: ``python -m benchmarks._child CONFIG_JSON``."""

from __future__ import annotations

import json
import sys

from benchmarks._harness import child_main

if __name__ == "__main__":
    print(json.dumps(child_main(json.loads(sys.argv[1]))), flush=True)
