"""16-bit weights stored as IEEE float16: mhsa.Model.load(dir, dtype="f16") (the CLI's --dtype f16).

- A checkpoint that transformers wrote in float16 (model.half().save_pretrained: F16 safetensors,
  as many checkpoints are published): the f16 model's logits are those of the float64 model on
  exactly those weights (within 1e-4 relative L2, the float32 test's bound: nothing is rounded,
  every sum is float32), mhsa's f32 model of the same directory within 1e-5, and no further from
  that float64 truth than transformers run in float16 (model.half(), the usual way of running
  such a checkpoint). Decoding through the cache equals the forward.
- A float32 checkpoint loaded with dtype "f16" is rounded to nearest-even, matrices only.
- The shipped default model, stored F16: f16 computes what f32 computes (logits, bits per byte).
- The dtype is reported, gradients are refused, a weight beyond float16's range is refused by name.
"""

import copy

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import mhsa

transformers = pytest.importorskip("transformers")
import families  # noqa: E402  (tests/python, beside this file)
from conftest import rel_l2 as rel  # noqa: E402
from families import logits  # noqa: E402
import test_default_model as d  # noqa: E402
from test_default_model import held_out  # noqa: E402,F401  (the fixture)

from test_bf16 import CASES as BF16_CASES, check_decoding_and_no_gradients  # noqa: E402

CASES = {**BF16_CASES, "gemma2": families.TINY["gemma2_softcap"]}


@pytest.mark.parametrize("case", list(CASES))
def test_an_f16_checkpoint_runs_as_stored(case, rng, tmp_path):
    config_class, kwargs, model_class = CASES[case]
    full = families.build(config_class, kwargs, model_class, int(rng.integers(2**31)))
    hf = copy.deepcopy(full).half()
    hf.save_pretrained(tmp_path)
    m = mhsa.Model.load(tmp_path, dtype="f16")
    assert m.dtype == "f16"
    ids = rng.integers(0, hf.config.vocab_size, size=(2, int(rng.integers(9, 20))))
    got = m.forward(ids)

    # The float64 model of the stored parameters (.half() also rounds buffers such as RoPE's
    # inv_freq, which no file stores: those stay exact), and transformers run as stored.
    stored = dict(hf.named_parameters())
    truth_model = full.double()
    with torch.no_grad():
        for name, p in truth_model.named_parameters():
            p.copy_(stored[name].double())
    truth = logits(truth_model, ids)
    theirs = logits(hf, ids)
    assert rel(got, truth) <= 1e-4
    assert rel(got, mhsa.Model.load(tmp_path).forward(ids)) <= 1e-5
    ours_err, theirs_err = rel(got, truth), rel(theirs, truth)
    assert ours_err <= theirs_err, f"mhsa f16 {ours_err:.3g} vs transformers float16 {theirs_err:.3g}"

    check_decoding_and_no_gradients(m, ids, got)


def test_a_float32_checkpoint_is_rounded_to_float16(rng, tmp_path):
    config_class, kwargs, model_class = CASES["llama"]
    hf = families.build(config_class, kwargs, model_class, int(rng.integers(2**31)))
    hf.save_pretrained(tmp_path)
    m = mhsa.Model.load(tmp_path, dtype="f16")
    ids = rng.integers(0, hf.config.vocab_size, size=(1, 13))
    rounded = copy.deepcopy(hf).double()
    with torch.no_grad():
        for _, p in rounded.named_parameters():
            if p.dim() == 2:
                p.copy_(p.half().double())
    assert rel(m.forward(ids), logits(rounded, ids)) <= 1e-4
    assert rel(m.forward(ids), logits(hf.double(), ids)) > 1e-5  # it was rounded: not the float32 model


def test_a_weight_beyond_float16s_range_is_refused_by_name(rng, tmp_path):
    config_class, kwargs, model_class = CASES["llama"]
    families.build(config_class, kwargs, model_class, int(rng.integers(2**31))).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.1.mlp.up_proj.weight"][3, 4] = 1e5
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(mhsa.Error, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*float16's range.*100000"):
        mhsa.Model.load(tmp_path, dtype="f16")
    assert mhsa.Model.load(tmp_path, dtype="bf16").dtype == "bf16"  # bf16 has float32's range


def test_default_model_computes_in_f16_what_it_computes_in_f32(held_out):
    """The shipped default model is stored F16, so its f16 model holds the very weights its f32 model
    widens: the same logits to float32 rounding, the same bits per byte (its first 16 windows of
    512 bytes; the whole held-out text: docs/performance-history.md)."""
    assert all(t.dtype == torch.float16 for t in load_file(d.MODEL / "model.safetensors").values()
               if t.dim() == 2)
    f32, f16 = (mhsa.Model.load(d.MODEL, dtype=t) for t in ("f32", "f16"))
    text = held_out[:16 * 512 + 1]
    ids = text[:512].astype(np.int32)[None]
    assert rel(f16.forward(ids), f32.forward(ids)) <= 1e-5
    a, b = (d.bits_per_byte(m, text, 512) for m in (f32, f16))
    print(f"default model: {a:.6f} bits per byte in f32, {b:.6f} in f16")
    assert abs(b / a - 1) <= 1e-5


def test_cli_dtype_f16():
    """--dtype f16 on generate: the default model's greedy text is f32's (the same weights)."""
    import subprocess

    def run(dtype):
        r = subprocess.run([str(d.CLI), "generate", "--dtype", dtype, "--prompt", "In the beginning", "-n", "24"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert run("f16") == run("f32")
