"""A short soak of `mhsa serve` (bench/serve_soak.py with 150 requests from 8 clients, a fifth of
them leaving mid-stream): every request answered once, equal greedy requests equal, the counters
exact, no sequence left active, memory back to its level after the warm-up, SIGTERM exits 0. The
1,000-request soak is the same script with its defaults (docs/performance-history.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))


def test_short_soak(rng):
    seed = int(rng.integers(2**32))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "serve_soak.py"), "--requests", "150", "--clients", "8",
                        "--max-tokens", "12", "--seed", str(seed), "--cli", str(CLI)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "soak ok" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
