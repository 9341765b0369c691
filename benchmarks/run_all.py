"""Run every benchmark, one after the other; each writes its results/<name>.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "plugin_loading.py",
    "compile_overhead.py",
    "verify_cost.py",
    "scaling.py",
    "npu_kernels.py",
    "zoo.py",
    "quantized.py",
    "engines.py",
    "outside_models.py",
)

if __name__ == "__main__":
    for script in BENCHMARKS:
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE)
