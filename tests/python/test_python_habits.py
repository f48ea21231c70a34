"""The Python module as a PyTorch and NumPy user reaches for it: Tokenizer.load reads every model
directory the CLI reads (a byte-level one without tokenizer files among them), float64 arrays
(NumPy's default: np.random.randn) are refused with the conversion named, never converted
silently, and MultiHeadAttention is callable as torch.nn.MultiheadAttention(batch_first=True) is,
m(q, k, v) -> (out, weights), checked against torch with the same weights.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest

import mhsa

torch = pytest.importorskip("torch")

from test_mha_torch import make_layer, torch_mha  # noqa: E402  (the same weights in torch's layer)

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "mhsa"


# ---- Tokenizer.load ----------------------------------------------------------------------------------

def test_tokenizer_load_reads_a_byte_level_model_directory():
    for where in [ROOT / "models" / "default", "models/default", "kjv"]:
        tok = mhsa.Tokenizer.load(where)
        assert tok.vocab_size == 256 and tok.encode("Hi") == [72, 105], where
    cli = subprocess.run([str(CLI), "tokenize", "-m", ROOT / "models" / "default", "And God"], capture_output=True,
                         text=True)
    if cli.returncode == 0:
        assert cli.stdout.split() == [str(i) for i in mhsa.Tokenizer.load(ROOT / "models" / "default").encode("And God")]


def test_tokenizer_load_of_a_directory_without_any_tokenizer_still_says_what_it_wanted(tmp_path):
    with pytest.raises(mhsa.Error, match="expected a directory with tokenizer.json"):
        mhsa.Tokenizer.load(tmp_path)


# ---- float64 -----------------------------------------------------------------------------------------

def test_float64_is_refused_naming_the_conversion():
    x = np.random.randn(1, 2, 3, 8)
    with pytest.raises(mhsa.Error) as e:
        mhsa.scaled_dot_product_attention(x, x, x)
    assert str(e.value) == ("scaled_dot_product_attention: q: expected dtype float32, got dtype float64 "
                            "(q.astype(numpy.float32) converts it; .float() a torch tensor)")
    m = mhsa.MultiHeadAttention(8, 2)
    with pytest.raises(mhsa.Error, match=r"MultiHeadAttention: x: expected dtype float32, got dtype float64 "
                                         r"\(x\.astype\(numpy\.float32\) converts it"):
        m(np.random.randn(1, 3, 8))
    with pytest.raises(mhsa.Error, match=r"w_o: expected dtype float32, got dtype float64 \(w_o\.astype"):
        m.w_o = np.random.randn(8, 8)
    with pytest.raises(mhsa.Error, match=r"got dtype int64 \(x\.astype\(numpy\.float32\)"):
        m(np.ones((1, 3, 8), dtype=np.int64))
    y = m(np.random.randn(1, 3, 8).astype(np.float32))  # the conversion named works
    assert y.shape == (1, 3, 8) and y.dtype == np.float32


# ---- MultiHeadAttention as torch's -------------------------------------------------------------------

def against_torch(m, q, kv, **kwargs):
    t = torch_mha(m, True, torch.float32)
    tk = torch.from_numpy(kv)
    targs = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    with torch.no_grad():
        ref_out, ref_w = t(torch.from_numpy(q), tk, tk, **targs)
    out, w = m(q, kv, kv, **kwargs)
    np.testing.assert_allclose(out, ref_out.numpy(), rtol=1e-4, atol=1e-5)
    if ref_w is None:
        assert w is None
    else:
        np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-4, atol=1e-6)
    return out, w


def test_self_attention_as_torch():
    rng = np.random.default_rng(0)
    m = make_layer(rng, 32, 4)
    x = rng.standard_normal((2, 7, 32), dtype=np.float32)
    out, w = against_torch(m, x, x)
    assert w.shape == (2, 7, 7)  # averaged over heads, as torch's default
    np.testing.assert_array_equal(out, m(x))  # the same layer as today's form
    _, w = against_torch(m, x, x, average_attn_weights=False)
    assert w.shape == (2, 4, 7, 7)
    assert against_torch(m, x, x, need_weights=False)[1] is None


def test_masks_as_torch():
    rng = np.random.default_rng(1)
    B, T, S, C, H = 2, 5, 9, 16, 2
    m = make_layer(rng, C, H)
    x = rng.standard_normal((B, T, C), dtype=np.float32)
    memory = rng.standard_normal((B, S, C), dtype=np.float32)
    causal = np.triu(np.ones((T, T), dtype=bool), 1)  # torch: True = masked out
    against_torch(m, x, x, attn_mask=causal)
    against_torch(m, x, memory, attn_mask=rng.standard_normal((T, S), dtype=np.float32))
    padding = np.zeros((B, S), dtype=bool)
    padding[1, 6:] = True
    against_torch(m, x, memory, key_padding_mask=padding)
    per_head = rng.standard_normal((B * H, T, S), dtype=np.float32)
    float_padding = np.where(padding, -np.inf, 0).astype(np.float32)  # torch wants one mask type for both
    against_torch(m, x, memory, key_padding_mask=float_padding, attn_mask=per_head, average_attn_weights=False)


def test_torch_form_refuses_what_the_layer_cannot_do():
    rng = np.random.default_rng(2)
    m = make_layer(rng, 16, 2)
    x = rng.standard_normal((1, 4, 16), dtype=np.float32)
    with pytest.raises(mhsa.Error, match=r"^MultiHeadAttention: value: expected the array given as key \(this layer "
                                         r"projects keys and values from one memory"):
        m(x, x, x + 1)
    with pytest.raises(mhsa.Error, match=r"attn_mask: expected \[T, S\] or \[B\*num_heads, T, S\], got a 4-D array"):
        m(x, x, x, attn_mask=np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(TypeError):
        m(x, x, x, dropout=0.1)  # not an argument of this layer
