"""Entry point of a benchmark child process: ``python -m streambuf.bench._child CONFIG``.

Prints the runner's JSON report as its last line of stdout.
"""

from __future__ import annotations

import json
import sys

from ._harness import call_runner

if __name__ == "__main__":
    print(json.dumps(call_runner(json.loads(sys.argv[1]))), flush=True)
