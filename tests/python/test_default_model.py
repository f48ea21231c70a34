"""The model mhsa trained itself (models/default, named "kjv"): its validation loss, measured here on
the held-out end of the text it was trained on, is at most 2.0 bits per byte and is the number
docs/default-model.md states; `mhsa generate` and `mhsa explain` run it by its name.

The text is the King James Bible exactly as scripts/train_default_model.sh extracts it from
Debian's bible-kjv-text package (installed by scripts/setup.sh --test)."""

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import mhsa

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
MODEL = ROOT / "models" / "default"


@pytest.fixture(scope="module")
def held_out():
    if shutil.which("bible") is None:
        pytest.fail("the `bible` program is missing: scripts/setup.sh --test installs bible-kjv and bible-kjv-text")
    text = subprocess.run(["bible", "-l80", "gen1:1-rev22:21"], capture_output=True, check=True,
                          env=dict(os.environ, COLUMNS="80")).stdout
    assert len(text) == 4_298_239, "the extraction differs from the one the model was trained on"
    n_val = round(len(text) * 0.05)  # the trainer's split: the last 5% was never trained on
    return np.frombuffer(text[len(text) - n_val:], np.uint8).astype(np.int64)


def bits_per_byte(model, tokens, T):
    windows = (len(tokens) - 1) // T
    total = 0.0
    for w0 in range(0, windows, 16):
        starts = range(w0, min(windows, w0 + 16))
        ids = np.stack([tokens[s * T:s * T + T] for s in starts])
        targets = np.stack([tokens[s * T + 1:s * T + T + 1] for s in starts])
        total += model.loss(ids, targets) * len(starts)
    return total / windows / math.log(2)


def test_shipped_model_meets_its_stated_validation_loss(held_out):
    size = (MODEL / "model.safetensors").stat().st_size
    assert size <= 16 * 2 ** 20
    model = mhsa.GPT2.load(MODEL)
    assert model.config["vocab_size"] == 256
    bpb = bits_per_byte(model, held_out, model.config["n_positions"])
    print(f"default model: {bpb:.4f} bits per byte on {len(held_out):,} held-out bytes")
    assert bpb <= 2.0
    stated = re.search(r"validation loss: \*\*([0-9.]+) bits per byte\*\*", (ROOT / "docs/default-model.md").read_text())
    assert stated and abs(float(stated.group(1)) - bpb) <= 0.001, (stated, bpb)


def test_generate_and_explain_run_it_by_name(tmp_path):
    r = subprocess.run([str(CLI), "generate", "--model", "kjv", "--prompt", "In the beginning", "-n", "40", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == len("In the beginning") and len(out["tokens"]) == 40
    words = re.findall(r"[a-z]+", out["text"].lower())
    assert words, out["text"]
    r = subprocess.run([str(CLI), "explain", "--model", "kjv", "--prompt", "And God said", "--format", "text"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
