"""Attention on 16-bit inputs: NumPy float16 and ml_dtypes bfloat16 arrays through mhsa's functions,
torch bfloat16 / float16 tensors through mhsa.torch.

- The functions: the result (out, and dq, dk, dv) equals, bit for bit, the float32 call on the
  exactly widened inputs with its results rounded to the dtype (NumPy's own nearest-even astype),
  lse equal as float32, on strided inputs with grouped heads, causal top-left and bottom-right, a
  window with a soft-cap, a mask with kv_lengths and dropout (where AVX512_BF16's dot product runs
  the bfloat16 forward and backward, mhsa.bf16_dot_product(): out within P's bfloat16 rounding, lse
  within float32's, dq, dk, dv within P's and dS's). Mixed dtypes are refused by name.
- mhsa.torch: forward and gradients (q, k, v and a 16-bit float mask) against PyTorch's float64
  math within the FlashAttention rule against PyTorch's own run in that dtype (its CPU kernels also
  compute in float32 and round once); patch() on a bfloat16 transformers Llama gives the unpatched
  logits within bfloat16's rounding.
"""

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mhsa
import mhsa.torch as mt
from conftest import rel_l2

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16}


def strided(rng, shape, dtype):
    """A random [B, H, T, E] array of dtype stored as [B, T, H, E] (a projection's layout)."""
    B, H, T, E = shape
    return rng.standard_normal((B, T, H, E), dtype=np.float32).astype(dtype).transpose(0, 2, 1, 3)


CASES = {  # Hq, Hkv, Tq, Tk, D, Dv, keywords
    "causal-bottom-right": (4, 2, 37, 53, 40, 24, dict(is_causal=True)),
    "causal-top-left": (4, 2, 37, 53, 40, 24, dict(is_causal=True, causal_alignment="top_left")),
    "window-softcap": (3, 3, 29, 29, 80, 80, dict(is_causal=True, window=(5, -1), softcap=7.0)),
    "mask-lengths-dropout": (2, 1, 19, 31, 96, 64, dict(kv_lengths=[31, 7], dropout_p=0.2, dropout_seed=11)),
    "T1": (2, 2, 1, 1, 40, 40, {}),
}


@pytest.mark.parametrize("dtype", DTYPES.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_16bit_equals_float32_on_widened_inputs_rounded(rng, dtype, case):
    dt = DTYPES[dtype]
    Hq, Hkv, Tq, Tk, D, Dv, kw = case
    kw = dict(kw)
    if "kv_lengths" in kw:
        kw["attn_mask"] = np.where(rng.random((Tq, Tk)) < 0.2, -np.inf, rng.standard_normal((Tq, Tk))).astype(np.float32)
    q, k, v = strided(rng, (2, Hq, Tq, D), dt), strided(rng, (2, Hkv, Tk, D), dt), strided(rng, (2, Hkv, Tk, Dv), dt)
    dout = strided(rng, (2, Hq, Tq, Dv), dt)
    wide = [a.astype(np.float32) for a in (q, k, v, dout)]

    out, lse = mhsa.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    out32, lse32 = mhsa.scaled_dot_product_attention(*wide[:3], return_lse=True, **kw)
    assert out.dtype == dt and lse.dtype == np.float32
    if dt == BF16 and mhsa.bf16_dot_product() and Tq > 8:
        # AVX512_BF16's forward: P rounded to bfloat16 for P·V (2^-9 of the values averaged), lse
        # from float32 sums in another order (the C++ test checks it against float64 on a grid).
        assert np.allclose(lse, lse32, rtol=2e-5, atol=2e-5)
        vmax = float(np.abs(wide[2]).max())
        assert np.all(np.abs(out.astype(np.float32) - out32) <= 2 ** -8 * (vmax + np.abs(out32)))
    else:
        assert np.array_equal(lse, lse32)
        assert np.array_equal(out.view(np.uint16), out32.astype(dt).view(np.uint16))

    grads = mhsa.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, **kw)
    grads32 = mhsa.scaled_dot_product_attention_backward(wide[3], *wide[:3], out.astype(np.float32), lse, **kw)
    if dt == BF16 and mhsa.bf16_dot_product() and Tq > 8:
        # AVX512_BF16's backward: P and dS rounded to bfloat16 (the C++ test checks it against
        # float64 on a grid). dv = Pᵀ dO within 2^-8 of Σ P|dO| (the float32 dv for |dout|) and of
        # itself; dq, dk (dS's rounding, summed with cancellation) within 1% relative L2.
        bound = mhsa.scaled_dot_product_attention_backward(np.abs(wide[3]), *wide[:3], out.astype(np.float32), lse,
                                                           **kw)[2]
        assert np.all(np.abs(grads[2].astype(np.float32) - grads32[2]) <= 2 ** -8 * (bound + np.abs(grads32[2])))
        for name, g, g32 in zip(("dq", "dk", "dv"), grads, grads32):
            assert g.dtype == dt and rel_l2(g.astype(np.float32), g32) <= 1e-2, name
        if kw.get("causal_alignment") == "top_left":  # row 0 sees key 0 alone: dS = 0, dq = 0 exactly
            assert np.all(grads[0][:, :, 0].view(np.uint16) == 0)
        return
    for name, g, g32 in zip(("dq", "dk", "dv"), grads, grads32):
        assert g.dtype == dt, name
        assert np.array_equal(g.view(np.uint16), g32.astype(dt).view(np.uint16)), name


def test_mixed_dtypes_are_refused_by_name(rng):
    q = strided(rng, (1, 2, 5, 8), np.float16)
    with pytest.raises(mhsa.Error, match=r"scaled_dot_product_attention: k: expected a 4-D float16 array"):
        mhsa.scaled_dot_product_attention(q, q.astype(np.float32), q)
    with pytest.raises(mhsa.Error, match=r"v: expected a 4-D float16 array .* got dtype bfloat16"):
        mhsa.scaled_dot_product_attention(q, q, q.astype(BF16))
    with pytest.raises(mhsa.Error, match=r"_backward: out: expected"):
        mhsa.scaled_dot_product_attention_backward(q, q, q, q, q.astype(np.float32), np.zeros((1, 2, 5), np.float32))


TORCH_CASES = {  # batch, Hq, Hkv, Tq, Tk, D, causal, float mask shape
    "causal-topleft-gqa": ((2,), 6, 2, 21, 40, 64, True, None),
    "float-mask-grad": ((2,), 4, 4, 17, 17, 40, False, (4, 17, 17)),
    "long-T97": ((1,), 2, 1, 97, 97, 96, True, None),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("case", TORCH_CASES.values(), ids=TORCH_CASES.keys())
def test_torch_16bit_matches_float64_within_torch_own_error(rng, dtype, case):
    batch, Hq, Hkv, Tq, Tk, D, causal, mask_shape = case
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    base = [torch.randn(*batch, h, t, D, generator=gen, dtype=torch.float64).to(dtype).double()
            for h, t in ((Hq, Tq), (Hkv, Tk), (Hkv, Tk))]
    mask = None if mask_shape is None else torch.randn(mask_shape, generator=gen, dtype=torch.float64).to(dtype).double()
    dout = torch.randn(*batch, Hq, Tq, D, generator=gen, dtype=torch.float64).to(dtype)
    kw = dict(is_causal=causal, enable_gqa=Hq != Hkv)

    def run(fn, dt):
        ts = [t.to(dt).requires_grad_() for t in base]
        if mask is not None:
            ts.append(mask.to(dt).requires_grad_())
        out = fn(*ts[:3], attn_mask=ts[3] if mask is not None else None, **kw)
        return [out] + list(torch.autograd.grad(out, ts, dout.to(out.dtype)))

    before = dict(mt.calls)
    ours = run(mt.scaled_dot_product_attention, dtype)
    assert mt.calls["forward"] == before["forward"] + 1 and mt.calls["backward"] == before["backward"] + 1
    theirs = run(F.scaled_dot_product_attention, dtype)
    ref = run(F.scaled_dot_product_attention, torch.float64)
    for name, o, t, r in zip(["out", "dq", "dk", "dv", "dmask"], ours, theirs, ref):
        assert o.dtype == dtype and o.shape == r.shape, name
        ours_err, torch_err = rel_l2(o.double(), r), rel_l2(t.double(), r)
        # One rounding to the dtype is 2^-9 (bfloat16) or 2^-12 (float16) relative at most.
        assert ours_err <= 2 * max(torch_err, 2.0 ** (-9 if dtype == torch.bfloat16 else -12)), (
            f"{name}: rel L2 {ours_err:.3g} against torch {dtype}'s {torch_err:.3g}")


def test_patch_on_a_bfloat16_llama(rng):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(int(rng.integers(2**31)))
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 97, (2, 23))
    with torch.no_grad():
        plain = model(ids).logits.double()
        before = mt.calls["forward"]
        with mt.patch():
            patched = model(ids).logits.double()
        assert mt.calls["forward"] == before + 2  # one call per layer ran on mhsa
        with torch.no_grad():
            exact = model.double()(ids).logits
    # Both runs round at every bfloat16 layer: each must be about as far from the float64 model.
    assert rel_l2(patched, exact) <= 2 * rel_l2(plain, exact) + 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_torch_16bit_op_checks_and_compiles(rng, dtype):
    """The fake gives a 16-bit out and a float32 lse, as the op does: opcheck passes and
    torch.compile(fullgraph=True) equals eager."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    q = torch.randn(2, 3, 11, 16, generator=gen).to(dtype)
    k = torch.randn(2, 3, 13, 16, generator=gen).to(dtype)
    torch.library.opcheck(torch.ops.mhsa.sdpa.default, (q, k, k, None, True, None, 0.0, None))
    fn = torch.compile(lambda a, b: mt.scaled_dot_product_attention(a, b, b, is_causal=True), fullgraph=True,
                       backend="aot_eager")
    got = fn(q, k)
    assert got.dtype == dtype
    assert torch.equal(got, mt.scaled_dot_product_attention(q, k, k, is_causal=True))
