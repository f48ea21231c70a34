"""`mhsa train --dtype bf16`: mixed-precision training (float32 master weights and AdamW state, the
matmuls reading a bfloat16 copy) through the CLI. Its final loss is within 1% of the float32 run
with the same seed; the checkpoints are the float32 format either way, so a run resumes across
dtypes; a stopped bf16 run resumes bit for bit; the dtype is recorded in the checkpoint's options
and on the log's step lines; any other --dtype is refused naming the option. Tiny models: seconds."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import mhsa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import B, CLI, ROOT, TINY, T, state, text, train  # noqa: E402,F401


def log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bf16_reaches_the_float32_loss_within_one_percent(text, tmp_path, rng, arch):
    seed = int(rng.integers(1000))
    shape = TINY if arch == "llama" else ["--arch", "gpt2", *TINY[2:6], *TINY[8:]]  # GPT-2: no --kv-heads
    args = ["--data", text, *shape, "--steps", 40, "--seed", seed]
    train(*args, "--out", tmp_path / "f32")
    train(*args, "--out", tmp_path / "bf16", "--dtype", "bf16")
    (h32, o32, t32), (h16, o16, t16) = state(tmp_path / "f32"), state(tmp_path / "bf16")
    assert "dtype" not in o32 and o16["dtype"] == "bf16"
    assert {k: v for k, v in o16.items() if k != "dtype"} == o32
    assert h32["val_bpb"][-1][1] < 0.8 * h32["val_bpb"][0][1]  # it learns
    assert h16["val_bpb"][-1][1] == pytest.approx(h32["val_bpb"][-1][1], rel=0.01)
    assert np.mean(h16["loss"][-10:]) == pytest.approx(np.mean(h32["loss"][-10:]), rel=0.01)
    assert h16["loss"] != h32["loss"]  # the bf16 run did round something
    assert t16.keys() == t32.keys() and all(t16[k].dtype == np.float32 for k in t16)  # float32 masters, AdamW
    assert all("dtype" not in x for x in log(tmp_path / "f32"))
    assert all(x.get("dtype") == "bf16" for x in log(tmp_path / "bf16") if "loss" in x)
    ours = mhsa.Model.load(tmp_path / "bf16")  # the same model directory as a float32 run's
    assert ours.forward(rng.integers(0, 256, size=(1, T))).shape == (1, T, 256)


def test_a_stopped_bf16_run_resumes_bit_for_bit(text, tmp_path, rng):
    args = ["--data", text, *TINY, "--steps", 10, "--seed", int(rng.integers(1000)), "--dtype", "bf16"]
    train(*args, "--out", tmp_path / "whole")
    train(*args, "--out", tmp_path / "parts", "--stop-after", 4)
    train("--data", text, "--out", tmp_path / "parts", "--resume")  # the checkpoint says bf16
    (ha, oa, ta), (hb, ob, tb) = state(tmp_path / "whole"), state(tmp_path / "parts")
    assert oa == ob and ob["dtype"] == "bf16" and ha == hb
    assert all(np.array_equal(ta[k], tb[k]) for k in ta)
    assert all(x.get("dtype") == "bf16" for x in log(tmp_path / "parts") if "loss" in x)


@pytest.mark.parametrize("first,then", [("f32", "bf16"), ("bf16", "f32")])
def test_a_run_resumes_in_the_other_dtype(text, tmp_path, rng, first, then):
    seed = int(rng.integers(1000))
    out = tmp_path / "m"
    train("--data", text, "--out", out, *TINY, "--steps", 10, "--seed", seed, "--dtype", first, "--stop-after", 5)
    r = train("--data", text, "--out", out, "--resume", "--dtype", then)
    assert "done at step 10" in r.stdout
    history, options, _ = state(out)
    assert options.get("dtype", "f32") == then and len(history["loss"]) == 10
    assert [x.get("dtype", "f32") for x in log(out) if "loss" in x] == [first] * 5 + [then] * 5
    # The first five steps are the first dtype's own: the same as an uninterrupted run of it.
    train("--data", text, "--out", tmp_path / "ref", *TINY, "--steps", 10, "--seed", seed, "--dtype", first)
    assert state(tmp_path / "ref")[0]["loss"][:5] == history["loss"][:5]


@pytest.mark.parametrize("bad", ["f16", "q8_0", "BF16", ""])
def test_another_dtype_is_refused_naming_the_option(text, tmp_path, bad):
    r = train("--data", text, "--out", tmp_path / "m", *TINY, "--steps", 2, "--dtype", bad, check=False)
    assert r.returncode == 2, r.stderr
    assert "--dtype" in r.stderr and "f32 or bf16" in r.stderr, r.stderr
    assert not (tmp_path / "m" / "train_state.safetensors").exists()
