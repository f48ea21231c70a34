"""Attention sinks (gpt-oss's learned per-head logit in each row's softmax sum) against PyTorch in
float64: the sink as one more score column, softmaxed with the row and dropped before P·V — the
definition, written independently here — forward (out, lse) and backward (dq, dk, dv and the
sinks' own gradient by autograd), at odd sizes, grouped heads, causal, window, padding and an
additive mask; sinks large enough that every row's lse is past 16 (the backward's recomputed
rows); and a 16-bit KV cache giving, bit for bit, the float32 call on its rounded keys and values."""

import ml_dtypes
import numpy as np
import pytest
import torch

import mhsa


def reference(q, k, v, sinks, visible, scale):
    """out, lse of attention with sinks in float64; visible: bool [B|1, Hq|1, Tq, Tk]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    s = scale * q @ k.transpose(-1, -2)
    s = s.masked_fill(~visible, float("-inf"))
    sink = sinks.view(1, -1, 1, 1).expand(q.shape[0], q.shape[1], q.shape[2], 1)
    full = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    p = torch.exp(full - lse[..., None])[..., :-1]
    return p @ v, lse


def visibility(B, Hq, Tq, Tk, causal, window_left, lengths):
    i = torch.arange(Tq)[:, None] + (Tk - Tq)  # bottom-right alignment
    j = torch.arange(Tk)[None, :]
    ok = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window_left >= 0:
        ok &= j >= i - window_left
    ok = ok.expand(B, Hq, Tq, Tk).clone()
    if lengths is not None:
        for b, n in enumerate(lengths):
            ok[b, :, :, n:] = False
    return ok


CASES = [  # B, Hq, Hkv, Tq, Tk, D, causal, window_left, padded, sink center
    (2, 4, 2, 97, 97, 40, True, -1, False, 0.0),
    (1, 6, 2, 1, 1025, 80, True, -1, False, 1.0),
    (2, 3, 3, 33, 70, 96, False, 20, True, -2.0),
    (1, 2, 1, 64, 64, 64, True, -1, False, 25.0),
    (1, 4, 4, 1025, 1025, 40, True, 256, False, 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_Hq{}_Hkv{}_Tq{}_Tk{}_D{}_sink{}".format(*c[:6], c[9]))
def test_forward_and_backward_match_torch_float64(case):
    B, Hq, Hkv, Tq, Tk, D, causal, window_left, padded, center = case
    rng = np.random.default_rng()
    q = rng.standard_normal((B, Hq, Tq, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
    dout = rng.standard_normal((B, Hq, Tq, D), dtype=np.float32)
    sinks = (center + rng.standard_normal(Hq)).astype(np.float32)
    lengths = [Tk - 7 * b - 3 for b in range(B)] if padded else None
    window = (window_left, -1) if window_left >= 0 else None
    opts = dict(is_causal=causal, kv_lengths=lengths, window=window, sinks=sinks)

    out, lse = mhsa.scaled_dot_product_attention(q, k, v, return_lse=True, **opts)
    dq, dk, dv, dsinks = mhsa.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, **opts)

    t = {name: torch.tensor(a, dtype=torch.float64, requires_grad=True) for name, a in
         dict(q=q, k=k, v=v, sinks=sinks).items()}
    visible = visibility(B, Hq, Tq, Tk, causal, window_left, lengths)
    want, want_lse = reference(t["q"], t["k"], t["v"], t["sinks"], visible, 1 / np.sqrt(D))
    want.backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=0, atol=2e-5 * float(want.detach().abs().max()))
    np.testing.assert_allclose(lse, want_lse.detach().numpy(), rtol=2e-6, atol=2e-6)
    for name, got in dict(q=dq, k=dk, v=dv, sinks=dsinks).items():
        g = t[name].grad.numpy()
        np.testing.assert_allclose(got, g, rtol=0, atol=1e-4 * max(1.0, float(np.abs(g).max())), err_msg=f"d{name}")


def test_additive_mask_and_probabilities():
    rng = np.random.default_rng()
    B, Hq, T, D = 1, 2, 19, 40
    q, k, v = (rng.standard_normal((B, Hq, T, D), dtype=np.float32) for _ in range(3))
    mask = rng.standard_normal((T, T)).astype(np.float32)
    mask[rng.random((T, T)) < 0.2] = -np.inf
    sinks = rng.standard_normal(Hq).astype(np.float32)
    out, lse = mhsa.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True, sinks=sinks)
    s = torch.tensor(q, dtype=torch.float64) @ torch.tensor(k, dtype=torch.float64).transpose(-1, -2) / np.sqrt(D)
    s = s + torch.tensor(mask, dtype=torch.float64)
    full = torch.cat([s, torch.tensor(sinks, dtype=torch.float64).view(1, Hq, 1, 1).expand(B, Hq, T, 1)], -1)
    p = torch.softmax(full, -1)[..., :-1]
    np.testing.assert_allclose(out, (p @ torch.tensor(v, dtype=torch.float64)).numpy(), atol=2e-5)
    np.testing.assert_allclose(lse, torch.logsumexp(full, -1).numpy(), rtol=2e-6, atol=2e-6)
    probs = mhsa.attention_probabilities(q, k, attn_mask=mask, sinks=sinks)
    np.testing.assert_allclose(probs, p.numpy(), atol=1e-6)
    assert np.all(probs.sum(-1) < 1)  # the sink keeps its share


def test_a_16bit_cache_is_the_float32_call_on_its_values():
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 4, 1, 64), dtype=np.float32)
    k = rng.standard_normal((1, 2, 300, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 300, 64), dtype=np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    got, got_lse = mhsa.scaled_dot_product_attention(q, k, v, return_lse=True, kv_dtype="bf16", sinks=sinks)
    rounded = [a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in (k, v)]
    want, want_lse = mhsa.scaled_dot_product_attention(q, *rounded, return_lse=True, sinks=sinks)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_lse, want_lse)


def test_bad_sinks_are_named():
    q = np.zeros((1, 4, 2, 8), np.float32)
    k = np.zeros((1, 2, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"sinks: expected 4 logits \(one per query head, Hq = q.shape\[1\]\), got 2"):
        mhsa.scaled_dot_product_attention(q, k, k, sinks=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"sinks\[3\]: expected a finite logit, got inf"):
        mhsa.scaled_dot_product_attention(q, k, k, sinks=np.array([0, 0, 0, np.inf], np.float32))
    h = q.astype(ml_dtypes.bfloat16)
    out, lse = mhsa.scaled_dot_product_attention(h, h[:, :2], h[:, :2], return_lse=True, sinks=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="options.sinks: expected none in the 16-bit backward"):
        mhsa.scaled_dot_product_attention_backward(h, h, h[:, :2], h[:, :2], out, lse, sinks=np.zeros(4, np.float32))
