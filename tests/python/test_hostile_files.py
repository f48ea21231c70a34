"""Hostile files in place of a model's or a tokenizer's: JSON nested 100,000 levels deep (a crash
while formatting the error, before the fix), an eos_token_id beyond int32 (silently truncated), and
FIFOs where regular files belong (the CLI blocked forever). Each gives a short, clear mhsa.Error or
`mhsa: error:` line; the CLI runs under a timeout so that a hang fails the test."""

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import mhsa

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
DEFAULT = ROOT / "models" / "default"
DEEP = "[" * 100_000 + "]" * 100_000


def model_dir(tmp_path, config=None, fifo=None):
    """A copy of the default model, with config.json replaced by `config` and `fifo` a FIFO."""
    d = tmp_path / "model"
    d.mkdir()
    for name in ("config.json", "model.safetensors"):
        if name == fifo:
            os.mkfifo(d / name)
        elif name == "config.json" and config is not None:
            (d / name).write_text(config)
        else:
            os.symlink(DEFAULT / name, d / name)
    return d


def generate(d):
    return subprocess.run([str(CLI), "generate", "--model", str(d), "--prompt", "a", "-n", "1"],
                          capture_output=True, text=True, timeout=30)


def short_error(message, *fragments):
    assert len(message) < 300, message[:400]
    for f in fragments:
        assert f in message, message


def test_deep_safetensors_header(tmp_path):
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(DEEP)) + DEEP.encode())
    with pytest.raises(mhsa.Error) as e:
        mhsa.load_safetensors(str(path))
    short_error(str(e.value), str(path), "header: expected UTF-8 JSON nested at most 64 levels deep")


@pytest.mark.parametrize("key", ["n_layer", "task_specific_params"])  # a key read, one ignored
def test_deep_config(tmp_path, key):
    config = json.loads((DEFAULT / "config.json").read_text())
    text = json.dumps(dict(config, **{key: 0})).replace(f'"{key}": 0', f'"{key}": {DEEP}')
    d = model_dir(tmp_path, config=text)
    with pytest.raises(mhsa.Error) as e:
        mhsa.GPT2.load(d)
    short_error(str(e.value), str(d / "config.json"), "nested at most 64 levels deep")
    r = generate(d)
    assert r.returncode == 2, (r.returncode, r.stderr[:400])
    short_error(r.stderr, "mhsa: error:", str(d / "config.json"), "nested at most 64 levels deep")


def test_eos_token_id_beyond_int32(tmp_path):
    config = dict(json.loads((DEFAULT / "config.json").read_text()), eos_token_id=2 ** 40)
    d = model_dir(tmp_path, config=json.dumps(config))
    with pytest.raises(mhsa.Error) as e:
        mhsa.GPT2.load(d)
    short_error(str(e.value), "config.json: eos_token_id: expected an integer in [-2147483648, 2147483647], got 1099511627776")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_fifo_in_a_model_directory(tmp_path, name):
    d = model_dir(tmp_path, fifo=name)
    try:
        r = generate(d)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mhsa generate blocked on a FIFO {name}")
    assert r.returncode == 2, r.stderr
    short_error(r.stderr, str(d / name), "expected a regular file, got a FIFO")


def test_fifo_training_data(tmp_path):
    os.mkfifo(tmp_path / "data.txt")
    try:
        r = subprocess.run([str(CLI), "train", "--data", str(tmp_path / "data.txt"), "--out", str(tmp_path / "out"),
                            "--steps", "1"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("mhsa train blocked on a FIFO")
    assert r.returncode == 2, r.stderr
    short_error(r.stderr, "data: expected a regular file, got a FIFO")
