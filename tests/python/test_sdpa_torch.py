"""mhsa.scaled_dot_product_attention and mhsa.attention_probabilities against PyTorch.

Each case runs mhsa in fp32, plain torch attention in float64 (the reference) and
torch.nn.functional.scaled_dot_product_attention in fp32 (torch's own error), and holds out and
lse to the acceptance bar of conftest.check_against_torch. Covered: odd sizes, Tq != Tk, causal
(bottom-right), float and bool masks in every broadcast form, kv_lengths, GQA, custom scales,
non-contiguous inputs, fully masked rows (0 / -inf, never NaN), torch tensors as inputs; the
variants: sliding windows (against an explicit torch mask and transformers' Mistral/Gemma 2 mask),
top-left causal alignment (torch's is_causal with Tq != Tk), soft-capping (Gemma 2's formula).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mhsa
from conftest import check_against_torch, key_bias, torch_attention, visible_keys


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def additive_bias(mask, visible):
    """The attn_mask (None, float or bool, any broadcast form) and the visible keys as one float64
    additive bias broadcastable to [B, Hq, Tq, Tk]."""
    bias = key_bias(visible)
    if mask is None:
        return bias
    m = torch.as_tensor(np.asarray(mask))
    if m.dtype == torch.bool:
        m = torch.where(m, 0.0, -math.inf)
    return bias + m.double().reshape((1,) * (4 - m.dim()) + tuple(m.shape))


def run_case(q, k, v, mask=None, causal=False, scale=None, kv_lengths=None):
    """mhsa against both torch computations, out and lse; returns mhsa's (out, lse)."""
    out, lse = mhsa.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                 kv_lengths=kv_lengths, return_lse=True)
    B, _, Tq, D = q.shape
    bias = additive_bias(mask, visible_keys(B, Tq, k.shape[2], causal, kv_lengths))
    s = 1 / math.sqrt(D) if scale is None else scale
    q32, k32, v32 = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    ref_out, ref_lse, _ = torch_attention(q32.double(), k32.double(), v32.double(), s, bias)
    seen = torch.isfinite(ref_lse)
    torch_out = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=bias.float(), scale=s, enable_gqa=True)
    torch_out = torch.where(seen[..., None], torch_out, 0)  # torch < 2.5 gives NaN for masked rows
    _, torch_lse, _ = torch_attention(q32, k32, v32, s, bias.float())

    check_against_torch(out, torch_out, ref_out)
    seen = seen.numpy()
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[~seen] == 0).all(), "rows with no visible key must give 0"
    assert (lse[~seen] == -np.inf).all(), "rows with no visible key must give lse -inf"
    if seen.any():
        check_against_torch(lse[seen], torch_lse.numpy()[seen], ref_lse.numpy()[seen])
    return out, lse


SHAPES = {  # B, Hq, Hkv, Tq, Tk, D, Dv
    "T97-D40": (2, 3, 3, 97, 97, 40, 40),
    "T1025-D96": (1, 2, 2, 1025, 1025, 96, 96),
    "decode-Tk97-D80": (2, 2, 2, 1, 97, 80, 80),
    "Tq5-Tk33-D64": (2, 2, 2, 5, 33, 64, 64),
    "Tq33-Tk17-D40": (2, 2, 2, 33, 17, 40, 40),  # causal: the first 16 rows see no key
    "T1-D80": (3, 2, 2, 1, 1, 80, 80),
    "T17-D1": (2, 3, 3, 17, 17, 1, 1),
    "Tq33-Tk65-D128": (1, 2, 2, 33, 65, 128, 128),
    "Tq9-Tk40-D256": (1, 1, 1, 9, 40, 256, 256),
    "Dv24-D40": (2, 2, 2, 13, 21, 40, 24),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_shapes(rng, shape, causal):
    B, Hq, Hkv, Tq, Tk, D, Dv = shape
    run_case(randn(rng, B, Hq, Tq, D), randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, Dv), causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("Tq,Tk", [(97, 97), (5, 33), (1, 40)])
@pytest.mark.parametrize("Hkv", [2, 3])
def test_grouped_query_heads(rng, Hkv, Tq, Tk, causal):
    B, Hq, D = 2, 6, 40
    run_case(randn(rng, B, Hq, Tq, D), randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, D), causal=causal)


MASK_FORMS = {  # the mask's shape for B=2, Hq=3, Tq=7, Tk=19
    "[Tq,Tk]": (7, 19),
    "[1,Tq,Tk]": (1, 7, 19),
    "[Hq,Tq,Tk]": (3, 7, 19),
    "[1,1,Tq,Tk]": (1, 1, 7, 19),
    "[B,1,Tq,Tk]": (2, 1, 7, 19),
    "[1,Hq,Tq,Tk]": (1, 3, 7, 19),
    "[B,Hq,Tq,Tk]": (2, 3, 7, 19),
}


def random_mask(rng, shape, kind):
    """A float mask (values of a few units, ~20% -inf) or a bool mask (~80% True), with row 3
    removed entirely so that every form has fully masked rows."""
    if kind == "bool":
        mask = rng.random(shape) < 0.8
        mask[..., 3, :] = False
        return mask
    mask = 2 * randn(rng, *shape)
    mask[rng.random(shape) < 0.2] = -np.inf
    mask[..., 3, :] = -np.inf
    return mask


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["float", "bool"])
@pytest.mark.parametrize("form", MASK_FORMS.values(), ids=MASK_FORMS.keys())
def test_masks(rng, form, kind, causal):
    B, Hq, Tq, Tk, D = 2, 3, 7, 19, 40
    q, k, v = randn(rng, B, Hq, Tq, D), randn(rng, B, Hq, Tk, D), randn(rng, B, Hq, Tk, D)
    out, lse = run_case(q, k, v, mask=random_mask(rng, form, kind), causal=causal)
    assert (out[:, :, 3] == 0).all() and (lse[:, :, 3] == -np.inf).all()


@pytest.mark.parametrize("Tq,Tk,causal", [(9, 9, False), (9, 9, True), (1, 97, False), (5, 33, True)])
def test_kv_lengths(rng, Tq, Tk, causal):
    B, Hq, D = 4, 2, 40
    lengths = [Tk, 0, int(rng.integers(1, Tk + 1)), 1]
    q, k, v = randn(rng, B, Hq, Tq, D), randn(rng, B, Hq, Tk, D), randn(rng, B, Hq, Tk, D)
    out, lse = run_case(q, k, v, causal=causal, kv_lengths=lengths)
    assert (out[1] == 0).all() and (lse[1] == -np.inf).all()


def test_kv_lengths_accepts_integer_sequences(rng):
    q, k, v = randn(rng, 3, 2, 5, 16), randn(rng, 3, 2, 11, 16), randn(rng, 3, 2, 11, 16)
    lengths = [11, 0, 4]
    want = mhsa.scaled_dot_product_attention(q, k, v, kv_lengths=lengths)
    for given in (tuple(lengths), np.array(lengths, np.int32), np.array(lengths, np.uint8), torch.tensor(lengths)):
        got = mhsa.scaled_dot_product_attention(q, k, v, kv_lengths=given)
        assert np.array_equal(got, want), f"kv_lengths given as {type(given).__name__}"


@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0, 3.0])
def test_custom_scale(rng, scale):
    q, k, v = randn(rng, 2, 3, 13, 64), randn(rng, 2, 3, 29, 64), randn(rng, 2, 3, 29, 64)
    run_case(q, k, v, scale=scale, causal=True)


def test_transposed_projection_layout(rng):
    """q, k, v as [B, H, T, D] views of one fused [B, T, 3, H, D] projection buffer."""
    B, T, H, D = 2, 97, 3, 40
    qkv = randn(rng, B, T, 3, H, D)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    run_case(q, k, v, causal=True)


def test_negative_and_step_strides(rng):
    B, Hq, Hkv, Tq, Tk, D = 2, 6, 3, 5, 33, 40
    q = randn(rng, B, Hq, Tq, 2 * D)[..., 1::2]        # every other element of each row
    k = randn(rng, B, Hkv, Tk, D)[:, :, ::-1]           # tokens in reverse order
    v = randn(rng, B, Hkv, Tk + 4, D)[:, ::-1, 2:-2]    # heads reversed, tokens sliced
    run_case(q, k, v, causal=True, kv_lengths=[Tk, 17])


def test_fortran_order(rng):
    q, k, v = (np.asfortranarray(randn(rng, 2, 3, T, 24)) for T in (7, 19, 19))
    run_case(q, k, v, mask=random_mask(rng, (7, 19), "float"))


def test_fully_masked_rows(rng):
    """Every way to remove all of a row's keys gives out 0 and lse -inf, and probabilities 0."""
    B, Hq, Tq, Tk, D = 2, 2, 6, 8, 16
    q, k, v = randn(rng, B, Hq, Tq, D), randn(rng, B, Hq, Tk, D), randn(rng, B, Hq, Tk, D)
    bool_mask = np.ones((Tq, Tk), bool)
    bool_mask[1] = False
    float_mask = np.zeros((B, Hq, Tq, Tk), np.float32)
    float_mask[0, 1, 2] = -np.inf
    cases = [  # (options, the [b, h, i] rows they empty)
        ({"attn_mask": bool_mask}, (slice(None), slice(None), 1)),
        ({"attn_mask": float_mask}, (0, 1, 2)),
        ({"kv_lengths": [Tk, 0]}, (1,)),
        ({"is_causal": True, "kv_lengths": [0, 0]}, (slice(None),)),
    ]
    for options, rows in cases:
        out, lse = mhsa.scaled_dot_product_attention(q, k, v, return_lse=True, **options)
        probs = mhsa.attention_probabilities(q, k, **options)
        assert not np.isnan(out).any() and not np.isnan(lse).any() and not np.isnan(probs).any(), options
        assert (out[rows] == 0).all() and (lse[rows] == -np.inf).all() and (probs[rows] == 0).all(), options


def test_empty_query(rng):
    out, lse = mhsa.scaled_dot_product_attention(randn(rng, 2, 3, 0, 8), randn(rng, 2, 3, 5, 8),
                                                 randn(rng, 2, 3, 5, 6), return_lse=True)
    assert out.shape == (2, 3, 0, 6) and lse.shape == (2, 3, 0)


PROB_CASES = {  # B, Hq, Hkv, Tq, Tk, D, causal, with a bool mask, kv_lengths, scale
    "T97-causal": (2, 3, 3, 97, 97, 80, True, False, None, None),
    "gqa-decode": (2, 6, 2, 1, 97, 40, False, False, [97, 50], None),
    "masked-padded": (2, 3, 3, 7, 19, 40, True, True, [19, 0], None),
    "Tq5-Tk33-D256": (1, 2, 1, 5, 33, 256, True, False, None, None),
    "large-logits": (2, 2, 2, 16, 40, 64, False, False, None, 4.0),
}


@pytest.mark.parametrize("case", PROB_CASES.values(), ids=PROB_CASES.keys())
def test_attention_probabilities(rng, case):
    """The torch bar, 1e-6 absolute against float64, and rows summing to 1 (0 when fully masked),
    at every scale: mhsa renormalises each row, so its fp32 lse (off by ~|lse| * 2^-24 at large
    logits) does not leak into the probabilities."""
    B, Hq, Hkv, Tq, Tk, D, causal, masked, lengths, scale = case
    q, k = randn(rng, B, Hq, Tq, D), randn(rng, B, Hkv, Tk, D)
    mask = random_mask(rng, (Tq, Tk), "bool") if masked else None
    probs = mhsa.attention_probabilities(q, k, attn_mask=mask, is_causal=causal, scale=scale, kv_lengths=lengths)
    bias = additive_bias(mask, visible_keys(B, Tq, Tk, causal, lengths))
    s = 1 / math.sqrt(D) if scale is None else scale
    q32, k32, v32 = torch.from_numpy(q), torch.from_numpy(k), torch.zeros(B, Hkv, Tk, 1)
    _, lse, ref = torch_attention(q32.double(), k32.double(), v32.double(), s, bias)
    _, _, torch_probs = torch_attention(q32, k32, v32, s, bias.float())
    assert probs.shape == (B, Hq, Tq, Tk)
    check_against_torch(probs, torch_probs, ref)
    np.testing.assert_allclose(probs, ref.numpy(), rtol=0, atol=1e-6)
    sums = probs.astype(np.float64).sum(-1)
    np.testing.assert_allclose(sums, torch.isfinite(lse).double().numpy(), rtol=0, atol=1e-6)


def test_torch_tensor_inputs(rng):
    """CPU float32 tensors, a transposed view among them, give exactly the NumPy result."""
    B, Hq, Hkv, Tq, Tk, D = 2, 6, 3, 5, 33, 40
    q = randn(rng, B, Tq, Hq, D).transpose(0, 2, 1, 3)
    k, v = randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, D)
    mask = random_mask(rng, (Hq, Tq, Tk), "bool")
    options = {"is_causal": True, "kv_lengths": [Tk, 9], "return_lse": True}
    want_out, want_lse = mhsa.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)
    tq = torch.from_numpy(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(1, 2)
    got_out, got_lse = mhsa.scaled_dot_product_attention(tq, torch.from_numpy(k), torch.from_numpy(v),
                                                         attn_mask=torch.from_numpy(mask), **options)
    assert np.array_equal(got_out, want_out) and np.array_equal(got_lse, want_lse)
    run_case(q, k, v, mask=mask, causal=True, kv_lengths=[Tk, 9])


NAN_CASES = {  # B, H, Tq, Tk, D: a decode-shaped case (split-K path) and a blocked one
    "decode": (1, 2, 4, 600, 40),
    "blocked": (1, 2, 70, 300, 64),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", NAN_CASES.values(), ids=NAN_CASES.keys())
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_propagates_like_torch(rng, where, shape, causal):
    """A NaN in q makes its row NaN (out and lse); a NaN in a key or value makes NaN every row
    that sees that key (the value's column only), as PyTorch's math path does; no NaN row is passed
    off as a masked one (0 / -inf). Rows that do not see a NaN key (causal) stay exact."""
    B, H, Tq, Tk, D = shape
    q, k, v = randn(rng, B, H, Tq, D), randn(rng, B, H, Tk, D), randn(rng, B, H, Tk, D)
    row, key = Tq // 2, Tk - Tq + Tq // 2  # with causal, rows >= row see key
    {"q": q, "k": k, "v": v}[where][0, 1, row if where == "q" else key, 3] = np.nan
    out, lse = mhsa.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal and Tq == Tk).numpy()
    if causal and Tq != Tk:  # torch's is_causal is top-left: use the bottom-right bias instead
        bias = key_bias(visible_keys(B, Tq, Tk, True), torch.float32)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=bias).numpy()
    sees = np.zeros((B, H, Tq), bool)
    if where == "q":
        sees[0, 1, row] = True
    else:
        sees[0, 1] = np.arange(Tq) >= row if causal else True
    np.testing.assert_array_equal(np.isnan(out)[sees], np.isnan(want)[sees])  # element by element
    assert np.isnan(out[sees]).any(-1).all()
    if where != "v":  # a NaN value past a row's causal limit may reach it (as 0 * NaN; unspecified)
        np.testing.assert_array_equal(np.isnan(out).any(-1), sees)
    np.testing.assert_array_equal(np.isnan(lse), sees if where != "v" else np.zeros_like(sees))
    if where == "k":  # rows that never see the NaN key are as if it were any number
        k[0, 1, key, 3] = 0
        clean, _, _ = torch_attention(*(torch.from_numpy(a).double() for a in (q, k, v)), 1 / math.sqrt(D),
                                      key_bias(visible_keys(B, Tq, Tk, causal)))
        np.testing.assert_allclose(out[~sees], clean.numpy()[~sees], rtol=0, atol=1e-5)


def test_nan_past_kv_lengths_is_never_read(rng):
    """A cache may hold anything past its valid length: NaN there changes nothing."""
    B, H, Tq, Tk, D = 2, 2, 70, 300, 40
    q, k, v = randn(rng, B, H, Tq, D), randn(rng, B, H, Tk, D), randn(rng, B, H, Tk, D)
    out, lse = mhsa.scaled_dot_product_attention(q, k, v, kv_lengths=[Tk, 200], return_lse=True)
    k[1, :, 200:], v[1, :, 200:] = np.nan, np.nan
    out2, lse2 = mhsa.scaled_dot_product_attention(q, k, v, kv_lengths=[Tk, 200], return_lse=True)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)


@pytest.mark.parametrize("Tq", [1, 8, 16, 64])
@pytest.mark.parametrize("Tk", [1025, 4096, 8192])
def test_long_nearly_uniform_rows(rng, Tk, Tq):
    """Small q and k make every row nearly uniform over thousands of keys: the softmax sum and the
    output are sums of Tk similar terms, whose rounding must not grow with Tk (blocked sums).
    Tq 1 and 8 take the split-K decode path, 16 and 64 the blocked one."""
    B, H, D = 1, 2, 64
    q, k = 0.05 * randn(rng, B, H, Tq, D), 0.05 * randn(rng, B, H, Tk, D)
    v = randn(rng, B, H, Tk, D)
    out, lse = mhsa.scaled_dot_product_attention(q, k, v, return_lse=True)
    s = 1 / math.sqrt(D)
    q64, k64, v64 = (torch.from_numpy(a).double() for a in (q, k, v))
    ref_out, ref_lse, _ = torch_attention(q64, k64, v64, s)
    torch_out = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)))
    check_against_torch(out, torch_out, ref_out)
    math_out, torch_lse, _ = torch_attention(*(torch.from_numpy(a) for a in (q, k, v)), s)
    check_against_torch(out, math_out, ref_out)
    check_against_torch(lse, torch_lse, ref_lse)


# ---- Variants: sliding windows, causal alignment, soft-capping ----


def variant_visible(B, Tq, Tk, causal=False, window=None, top_left=False, kv_lengths=None):
    """Bool [B, 1, Tq, Tk] written out in torch: query i stands at key position p = i + Tk - Tq
    (bottom-right) or i (top-left); causal keeps j <= p, window (left, right) keeps
    p - left <= j <= p + right (-1: unlimited), kv_lengths j < length."""
    i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
    p = i if top_left else i + (Tk - Tq)
    visible = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if causal:
        visible &= j <= p
    if window is not None and window[0] >= 0:
        visible &= j >= p - window[0]
    if window is not None and window[1] >= 0:
        visible &= j <= p + window[1]
    if kv_lengths is not None:
        visible &= j < torch.as_tensor(np.asarray(kv_lengths)).view(B, 1, 1, 1)
    return visible


def capped_attention(q, k, v, scale, bias, softcap):
    """Gemma 2's eager attention: scores * scale, softcap * tanh(scores / softcap), + bias."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    return probs @ v, lse, probs


def run_variant(q, k, v, causal=False, window=None, top_left=False, softcap=None, kv_lengths=None, mask=None):
    """mhsa with the variant options against the torch float64 formula and torch's fp32 error."""
    options = dict(is_causal=causal, window=window, softcap=softcap, kv_lengths=kv_lengths, attn_mask=mask,
                   causal_alignment="top_left" if top_left else "bottom_right")
    out, lse = mhsa.scaled_dot_product_attention(q, k, v, return_lse=True, **options)
    B, _, Tq, D = q.shape
    bias = additive_bias(mask, variant_visible(B, Tq, k.shape[2], causal, window, top_left, kv_lengths))
    s = 1 / math.sqrt(D)
    q32, k32, v32 = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    ref_out, ref_lse, ref_probs = capped_attention(q32.double(), k32.double(), v32.double(), s, bias, softcap)
    torch_out, torch_lse, torch_probs = capped_attention(q32, k32, v32, s, bias.float(), softcap)
    seen = torch.isfinite(ref_lse).numpy()
    check_against_torch(out, torch_out, ref_out)
    assert (out[~seen] == 0).all() and (lse[~seen] == -np.inf).all()
    if seen.any():
        check_against_torch(lse[seen], torch_lse.numpy()[seen], ref_lse.numpy()[seen])
    probs = mhsa.attention_probabilities(q, k, **options)
    np.testing.assert_allclose(probs, ref_probs.numpy(), rtol=0, atol=1e-6)
    return out, lse


VARIANT_SHAPES = {  # B, Hq, Hkv, Tq, Tk, D
    "T97-D40": (2, 3, 3, 97, 97, 40),
    "T1025-D96-gqa": (1, 2, 1, 1025, 1025, 96),
    "decode-Tk700-D80": (2, 6, 2, 1, 700, 80),
    "Tq5-Tk600-D80": (1, 2, 1, 5, 600, 80),  # split-K decode: slices before the window skipped
    "Tq5-Tk33-D40": (2, 2, 2, 5, 33, 40),
    "Tq33-Tk17-D96": (2, 2, 2, 33, 17, 96),
}
WINDOWS = {  # is_causal, window
    "sliding64": (True, (63, -1)),
    "both-sides": (False, (7, 11)),
    "right-only": (False, (-1, 3)),
    "one-key": (False, (0, 0)),
}


@pytest.mark.parametrize("top_left", [False, True], ids=["bottom_right", "top_left"])
@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
@pytest.mark.parametrize("shape", VARIANT_SHAPES.values(), ids=VARIANT_SHAPES.keys())
def test_windows(rng, shape, window, top_left):
    B, Hq, Hkv, Tq, Tk, D = shape
    causal, win = window
    run_variant(randn(rng, B, Hq, Tq, D), randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, D), causal=causal,
                window=win, top_left=top_left)


@pytest.mark.parametrize("softcap", [1.5, 5.0, 50.0])
@pytest.mark.parametrize("shape", VARIANT_SHAPES.values(), ids=VARIANT_SHAPES.keys())
def test_softcap(rng, shape, softcap):
    """Scores a few units large against caps that bend them a lot (1.5) or hardly (50)."""
    B, Hq, Hkv, Tq, Tk, D = shape
    q, k, v = 2 * randn(rng, B, Hq, Tq, D), 2 * randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, D)
    run_variant(q, k, v, causal=True, softcap=softcap)


def test_variants_with_masks_and_lengths(rng):
    B, Hq, Hkv, Tq, Tk, D = 3, 6, 3, 19, 41, 40
    q, k, v = randn(rng, B, Hq, Tq, D), randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, D)
    for mask in (random_mask(rng, (Hq, Tq, Tk), "float"), random_mask(rng, (B, 1, Tq, Tk), "bool")):
        for top_left in (False, True):
            run_variant(q, k, v, causal=True, window=(9, -1), top_left=top_left, softcap=3.0, kv_lengths=[Tk, 0, 30],
                        mask=mask)


@pytest.mark.parametrize("Tq,Tk", [(5, 33), (33, 5), (33, 17), (1, 40), (40, 1), (97, 97)])
def test_top_left_is_torch_is_causal(rng, Tq, Tk):
    """causal_alignment="top_left" gives torch.nn.functional.scaled_dot_product_attention(is_causal=True)
    for Tq != Tk both ways; the default bottom-right gives it only when Tq == Tk."""
    B, Hq, Hkv, D = 2, 4, 2, 40
    q, k, v = randn(rng, B, Hq, Tq, D), randn(rng, B, Hkv, Tk, D), randn(rng, B, Hkv, Tk, D)
    out = mhsa.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="top_left", enable_gqa=True)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(tq.double(), tk.double(), tv.double(), is_causal=True, enable_gqa=True)
    torch_out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    check_against_torch(out, torch_out, ref)
    bottom_right = mhsa.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert np.array_equal(bottom_right, out) == (Tq == Tk)


@pytest.mark.parametrize("W,Tq,Tk", [(4, 97, 97), (16, 40, 40), (16, 8, 100), (100, 30, 30)])
def test_window_is_hugging_face_sliding_window(rng, W, Tq, Tk):
    """transformers' sliding_window W (Mistral, Gemma 2: masking_utils' sliding-window causal mask,
    evaluated at the cache positions of the new rows) is is_causal=True with window=(W - 1, -1)."""
    masking = pytest.importorskip("transformers.masking_utils")
    i, j = torch.arange(Tq)[:, None] + (Tk - Tq), torch.arange(Tk)[None, :]
    hf = masking.sliding_window_causal_mask_function(W)(0, 0, i, j).expand(Tq, Tk).numpy()
    assert np.array_equal(hf, variant_visible(1, Tq, Tk, causal=True, window=(W - 1, -1))[0, 0].numpy())
    q, k, v = randn(rng, 1, 2, Tq, 40), randn(rng, 1, 2, Tk, 40), randn(rng, 1, 2, Tk, 40)
    out = mhsa.scaled_dot_product_attention(q, k, v, is_causal=True, window=(W - 1, -1))
    np.testing.assert_allclose(out, mhsa.scaled_dot_product_attention(q, k, v, attn_mask=hf), rtol=0, atol=2e-6)


def test_variant_option_errors(rng):
    q, k, v = randn(rng, 1, 4, 3, 8), randn(rng, 1, 2, 5, 8), randn(rng, 1, 2, 5, 8)
    sdpa = mhsa.scaled_dot_product_attention
    with pytest.raises(mhsa.Error, match=r"window.left: expected a key count >= 0, or -1 for unlimited, got -2"):
        sdpa(q, k, v, window=(-2, -1))
    with pytest.raises(mhsa.Error, match=r"window.right: .* got -3"):
        sdpa(q, k, v, window=(4, -3))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(mhsa.Error, match=r"softcap: expected a finite number > 0"):
            sdpa(q, k, v, softcap=bad)
    with pytest.raises(mhsa.Error, match=r'causal_alignment: expected "bottom_right" or "top_left", got "top-left"'):
        sdpa(q, k, v, is_causal=True, causal_alignment="top-left")
    with pytest.raises(mhsa.Error, match=r"enable_gqa=False"):
        sdpa(q, k, v, enable_gqa=False)
    assert np.array_equal(sdpa(q, k, v, enable_gqa=True), sdpa(q, k, v))
