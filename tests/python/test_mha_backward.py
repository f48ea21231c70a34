"""MultiHeadAttention backward against PyTorch autograd, and a layer that learns with plain SGD.

The layer is written out in torch (the same weights: qkv = x @ w_qkv + b_qkv, grouped heads,
y = ctx @ w_o + b_o) and differentiated by autograd in float64 (the reference) and float32
(torch's own error); dx, dmemory and every parameter gradient must meet
conftest.check_against_torch. Covered: self-attention plain and causal, key lengths, an additive
mask, grouped heads, cross-attention, no bias, gradient accumulation. The training check
teaches a single causal attention layer to copy the token two positions back.
"""

import math

import numpy as np
import pytest
import torch

import mhsa
from conftest import check_against_torch, key_bias, torch_attention, visible_keys
from test_mha_torch import make_layer


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def torch_layer_grads(m, bias, x, dy, memory=None, causal=False, kv_lengths=None, attn_mask=None,
                      dtype=torch.float64):
    """Autograd through the layer written out in torch: {name: gradient} for x, memory, parameters."""
    C, H, Hkv, D = m.embed_dim, m.num_heads, m.num_kv_heads, m.head_dim
    leaves = {"x": x, "w_qkv": m.w_qkv, "w_o": m.w_o}
    if memory is not None:
        leaves["memory"] = memory
    if bias:
        leaves.update(b_qkv=m.b_qkv, b_o=m.b_o)
    t = {k: torch.tensor(np.asarray(v), dtype=dtype, requires_grad=True) for k, v in leaves.items()}
    zero = torch.zeros(t["w_qkv"].shape[1], dtype=dtype)
    b_qkv, b_o = (t["b_qkv"], t["b_o"]) if bias else (zero, torch.zeros(C, dtype=dtype))
    xt = t["x"]
    mt = t.get("memory", xt)
    B, T, S = xt.shape[0], xt.shape[1], mt.shape[1]
    q = xt @ t["w_qkv"][:, :C] + b_qkv[:C]
    k = mt @ t["w_qkv"][:, C:C + Hkv * D] + b_qkv[C:C + Hkv * D]
    v = mt @ t["w_qkv"][:, C + Hkv * D:] + b_qkv[C + Hkv * D:]

    def heads(a, n):  # [B, T, n * D] -> [B, n, T, D]
        return a.view(B, -1, n, D).transpose(1, 2)

    mask_bias = key_bias(visible_keys(B, T, S, causal, kv_lengths), dtype)
    if attn_mask is not None:
        mask_bias = mask_bias + torch.from_numpy(attn_mask).to(dtype)
    ctx, _, _ = torch_attention(heads(q, H), heads(k, Hkv), heads(v, Hkv), 1 / math.sqrt(D), mask_bias)
    y = ctx.transpose(1, 2).reshape(B, T, C) @ t["w_o"] + b_o
    y.backward(torch.tensor(dy, dtype=dtype))
    return {name: leaf.grad.numpy() for name, leaf in t.items()}


CASES = {  # C, H, Hkv, B, T, S (None: self), causal, kv_lengths, mask, bias
    "self": (40, 5, None, 2, 17, None, False, None, False, True),
    "causal-T97": (64, 4, None, 1, 97, None, True, None, False, True),
    "lengths-mask": (48, 3, None, 3, 13, None, False, [13, 5, 1], True, True),
    "gqa-causal": (96, 6, 2, 2, 21, None, True, None, False, True),
    "cross": (40, 5, None, 2, 7, 23, False, [23, 9], False, True),
    "cross-gqa-nobias": (64, 8, 2, 1, 11, 30, False, None, False, False),
    "T1": (32, 4, None, 2, 1, None, True, None, False, True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_layer_gradients_match_autograd(rng, case):
    C, H, Hkv, B, T, S, causal, lengths, masked, bias = case
    m = make_layer(rng, C, H, num_kv_heads=Hkv, bias=bias)
    x, dy = randn(rng, B, T, C), randn(rng, B, T, C)
    memory = None if S is None else randn(rng, B, S, C)
    mask = randn(rng, T, T if S is None else S) if masked else None
    y = m(x, memory=memory, is_causal=causal, kv_lengths=lengths, attn_mask=mask, requires_grad=True)
    assert y.shape == (B, T, C)
    got = m.backward(dy)
    got = {"x": got[0], "memory": got[1]} if S is not None else {"x": got}
    got.update(m.grads)
    ref = torch_layer_grads(m, bias, x, dy, memory, causal, lengths, mask, torch.float64)
    fp32 = torch_layer_grads(m, bias, x, dy, memory, causal, lengths, mask, torch.float32)
    assert set(got) == set(ref)
    for name in ref:
        assert got[name].shape == ref[name].shape, name
        check_against_torch(got[name], fp32[name], ref[name])


def test_gradients_accumulate_until_zero_grad(rng):
    m = make_layer(rng, 32, 4)
    x, dy = randn(rng, 2, 9, 32), randn(rng, 2, 9, 32)
    m(x, is_causal=True, requires_grad=True)
    m.backward(dy)
    once = {k: v.copy() for k, v in m.grads.items()}
    m(x, is_causal=True, requires_grad=True)
    m.backward(dy)
    for name, g in m.grads.items():
        # The weight gradients are added inside the GEMM (C += Xᵀ·dY, a BLAS beta = 1), so the sum
        # is g + g to within float32 rounding rather than bit for bit: the second product's 18 row
        # terms are summed onto g in another order, an error up to (18 + 1)·eps of the terms' size
        # (seed 87387529 gave 4 ulp, 4.6e-7 of the largest element). A gradient overwritten
        # instead of added, or added twice, is off by all of g, far above this bound.
        rows = x.shape[0] * x.shape[1]
        bound = 4 * (rows + 1) * np.finfo(np.float32).eps * 2 * np.abs(once[name]).max()
        np.testing.assert_allclose(g, 2 * once[name], rtol=0, atol=bound)
    grads = m.grads
    m.zero_grad()
    assert all((g == 0).all() for g in grads.values())


def test_backward_needs_a_recorded_forward(rng):
    m = make_layer(rng, 16, 2)
    with pytest.raises(mhsa.Error, match="tape: expected a forward run with requires_grad=True first"):
        m.backward(randn(rng, 1, 3, 16))
    m(randn(rng, 1, 3, 16), requires_grad=True)
    with pytest.raises(mhsa.Error, match=r"dy.shape\[1\]: expected 3 \(T of the recorded forward\), got 4"):
        m.backward(randn(rng, 1, 4, 16))


def test_single_layer_learns_to_copy_two_back(rng):
    """Tokens one-hot in 8 channels, sinusoidal positions in the other 24; logits are y's first 8
    channels. Predicting the token two positions back needs attention from t to t - 2. Plain SGD
    on the layer's weights takes the cross-entropy from ln 8 = 2.08 to below 0.25."""
    V, C, T, B, back = 8, 32, 16, 32, 2
    m = mhsa.MultiHeadAttention(C, 2, seed=int(rng.integers(1 << 31)))
    pe = mhsa.sinusoidal_positional_encoding(T, C - V)
    lr, losses = 0.5, []
    for step in range(600):
        tokens = rng.integers(0, V, size=(B, T))
        x = np.concatenate([np.eye(V, dtype=np.float32)[tokens], np.broadcast_to(pe, (B, T, C - V))], axis=-1)
        y = m(x, is_causal=True, requires_grad=True)
        logits = y[:, back:, :V].astype(np.float64)
        target = tokens[:, :-back]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        losses.append(-np.log(np.take_along_axis(p, target[..., None], -1)).mean())
        dlogits = p
        dlogits[np.arange(B)[:, None], np.arange(T - back)[None, :], target] -= 1
        dy = np.zeros_like(y)
        dy[:, back:, :V] = dlogits / (B * (T - back))
        m.zero_grad()
        m.backward(dy)
        for name, g in m.grads.items():
            setattr(m, name, getattr(m, name) - lr * g)
    first, last = np.mean(losses[:10]), np.mean(losses[-20:])
    assert first > 1.9, f"the untrained loss should be near ln 8, got {first:.3f}"
    assert last < 0.25, f"loss {first:.3f} -> {last:.3f}: the layer did not learn to copy"
