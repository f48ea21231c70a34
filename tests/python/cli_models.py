"""Helpers shared by the CLI tests (not a test module): running `mhsa train` on a tiny Llama over
real prose, reading its checkpoint's train state, and writing a tiny random GPT-2 directory with
the real GPT-2 tokenizer files. Used by test_train_llama.py, test_train_bf16.py,
test_cli_serve.py and test_kv_dtype.py."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import safetensors
import torch

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"

# A tiny Llama for `mhsa train`: context T, batch B.
T, B = 24, 3
TINY = ["--arch", "llama", "--layers", 2, "--heads", 4, "--kv-heads", 2, "--embd", 32, "--context", T, "--batch", B,
        "--warmup", 3, "--eval-every", 5, "--lr", "3e-3", "--val-fraction", "0.04"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Real prose, 12 kB: its held-out 4% is 20 windows of 24 bytes, all of which validation reads."""
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes((ROOT / "docs" / "performance-history.md").read_bytes()[:12000])  # a record that no longer changes
    return path


def train(*args, check=True):
    r = subprocess.run([str(CLI), "train", *map(str, args)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="2"))
    if check:
        assert r.returncode == 0, r.stderr
    return r


def state(out):
    """A checkpoint's history, options and train-state tensors."""
    with safetensors.safe_open(str(out / "train_state.safetensors"), "np") as f:
        meta = f.metadata()
        return json.loads(meta["history"]), json.loads(meta["options"]), {k: f.get_tensor(k) for k in f.keys()}


def write_gpt2_dir(d, seed, n_embd=32):
    """A random GPT2LMHeadModel (C n_embd, 2 layers, 2 heads, context 128) saved by transformers, with
    the GPT-2 tokenizer's vocab.json and merges.txt; its embedding scaled ×20 for varied tokens."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=n_embd, n_layer=2, n_head=2, n_positions=128)).eval()
    with torch.no_grad():  # a livelier random model: varied tokens
        model.transformer.wte.weight.mul_(20.0)
    model.save_pretrained(d, safe_serialization=True)
    shutil.copy(TOKENIZER / "encoder.json", d / "vocab.json")
    shutil.copy(TOKENIZER / "vocab.bpe", d / "merges.txt")
    return d
