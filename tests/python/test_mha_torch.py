"""mhsa.MultiHeadAttention against PyTorch.

With the same weights (torch in_proj_weight = w_qkv.T, in_proj_bias = b_qkv, out_proj.weight =
w_o.T, out_proj.bias = b_o), torch.nn.MultiheadAttention(batch_first=True) in float64 is the
reference and in float32 gives torch's own error, and mhsa must meet conftest.check_against_torch:
self-attention, causal, key padding, cross-attention (memory as an array and projected once),
per-head weights, bias=False. Grouped-query layers and KV-cache decoding (step, token by token
and in chunks, reset) are checked against a plain torch re-implementation of the layer.
"""

import math

import numpy as np
import pytest
import torch

import mhsa
from conftest import check_against_torch, key_bias, torch_attention, visible_keys


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def make_layer(rng, C, H, num_kv_heads=None, bias=True):
    """A layer with fresh random weights and biases (its own init leaves the biases at 0)."""
    m = mhsa.MultiHeadAttention(C, H, num_kv_heads=num_kv_heads, bias=bias)
    m.w_qkv = randn(rng, *m.w_qkv.shape) / math.sqrt(C)
    m.w_o = randn(rng, C, C) / math.sqrt(C)
    if bias:
        m.b_qkv = 0.5 * randn(rng, *m.b_qkv.shape)
        m.b_o = 0.5 * randn(rng, C)
    return m


def parameters(m, bias, dtype):
    """w_qkv, b_qkv, w_o, b_o as torch tensors (zero biases for a layer without them)."""
    w_qkv, w_o = torch.tensor(m.w_qkv, dtype=dtype), torch.tensor(m.w_o, dtype=dtype)
    if not bias:
        return w_qkv, torch.zeros(w_qkv.shape[1], dtype=dtype), w_o, torch.zeros(m.embed_dim, dtype=dtype)
    return w_qkv, torch.tensor(m.b_qkv, dtype=dtype), w_o, torch.tensor(m.b_o, dtype=dtype)


def torch_mha(m, bias, dtype):
    t = torch.nn.MultiheadAttention(m.embed_dim, m.num_heads, bias=bias, batch_first=True, dtype=dtype)
    w_qkv, b_qkv, w_o, b_o = parameters(m, bias, dtype)
    with torch.no_grad():
        t.in_proj_weight.copy_(w_qkv.T)
        t.out_proj.weight.copy_(w_o.T)
        if bias:
            t.in_proj_bias.copy_(b_qkv)
            t.out_proj.bias.copy_(b_o)
    return t


def torch_attn_mask(attn_mask, causal, dtype, B, H, T, S):
    """Our is_causal or attn_mask (additive, or bool with True = attend) in nn.MultiheadAttention's
    form: [T, S] or [B * H, T, S], additive or bool with True = masked."""
    if causal:
        return torch.ones(T, S, dtype=torch.bool).triu(1)
    if attn_mask is None:
        return None
    m = torch.from_numpy(attn_mask)
    m = ~m if m.dtype == torch.bool else m.to(dtype)
    return m if m.dim() == 2 else m.expand(B, H, T, S).reshape(B * H, T, S)


def torch_results(m, bias, x, memory=None, causal=False, kv_lengths=None, need_weights=False, attn_mask=None):
    """torch.nn.MultiheadAttention's (y, per-head weights or None) in float64, then float32."""
    B, T = x.shape[:2]
    S = (x if memory is None else memory).shape[1]
    padding = None
    if kv_lengths is not None:
        padding = torch.arange(S)[None, :] >= torch.tensor(kv_lengths)[:, None]
    results = []
    for dtype in (torch.float64, torch.float32):
        xt = torch.from_numpy(np.ascontiguousarray(x)).to(dtype)
        mt = xt if memory is None else torch.from_numpy(np.ascontiguousarray(memory)).to(dtype)
        mask = torch_attn_mask(attn_mask, causal, dtype, B, m.num_heads, T, S)
        with torch.no_grad():
            results.append(torch_mha(m, bias, dtype)(xt, mt, mt, key_padding_mask=padding, attn_mask=mask,
                                                     need_weights=need_weights, average_attn_weights=False))
    return results


def check_layer(m, x, memory=None, causal=False, kv_lengths=None, bias=True, projected=False, attn_mask=None):
    """m(x, ...) against torch; with `projected`, the memory goes in as m.project_memory(memory)."""
    given = m.project_memory(memory) if projected else memory
    y = m(x, memory=given, is_causal=causal, kv_lengths=kv_lengths, attn_mask=attn_mask)
    (ref, _), (base, _) = torch_results(m, bias, x, memory, causal, kv_lengths, attn_mask=attn_mask)
    assert y.shape == x.shape
    check_against_torch(y, base, ref)


def reference_layer(m, x, memory=None, causal=False, kv_lengths=None, dtype=torch.float64):
    """The layer re-implemented in torch, grouped heads included: y [B, T, C]."""
    C, H, Hkv, D = m.embed_dim, m.num_heads, m.num_kv_heads, m.head_dim
    w_qkv, b_qkv, w_o, b_o = parameters(m, True, dtype)
    xt = torch.from_numpy(x).to(dtype)
    mt = xt if memory is None else torch.from_numpy(memory).to(dtype)
    B, T, S = xt.shape[0], xt.shape[1], mt.shape[1]
    q = xt @ w_qkv[:, :C] + b_qkv[:C]
    k = mt @ w_qkv[:, C:C + Hkv * D] + b_qkv[C:C + Hkv * D]
    v = mt @ w_qkv[:, C + Hkv * D:] + b_qkv[C + Hkv * D:]

    def heads(t, n):  # [B, T, n * D] -> [B, n, T, D]
        return t.view(B, -1, n, D).transpose(1, 2)

    bias = key_bias(visible_keys(B, T, S, causal, kv_lengths), dtype)
    ctx, _, _ = torch_attention(heads(q, H), heads(k, Hkv), heads(v, Hkv), 1 / math.sqrt(D), bias)
    return ctx.transpose(1, 2).reshape(B, T, C) @ w_o + b_o


def check_reference(y, m, x, memory=None, causal=False, kv_lengths=None):
    ref = reference_layer(m, x, memory, causal, kv_lengths)
    base = reference_layer(m, x, memory, causal, kv_lengths, torch.float32)
    check_against_torch(y, base, ref)


LAYERS = {"C40-H5": (40, 5), "C96-H4": (96, 4), "C64-H8": (64, 8)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("T", [1, 97])
@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_self_attention(rng, layer, T, causal):
    C, H = layer
    check_layer(make_layer(rng, C, H), randn(rng, 2, T, C), causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_key_padding(rng, causal):
    """kv_lengths against key_padding_mask; every row keeps a visible key (torch gives NaN else)."""
    C, H, T = 40, 5, 23
    lengths = [T, 1, int(rng.integers(2, T))]
    check_layer(make_layer(rng, C, H), randn(rng, 3, T, C), causal=causal, kv_lengths=lengths)


@pytest.mark.parametrize("T,S", [(5, 17), (1, 97), (97, 33)])
def test_cross_attention(rng, T, S):
    """memory as an array, and projected once and reused for two different x."""
    C, H, B = 96, 4, 2
    m, memory = make_layer(rng, C, H), randn(rng, B, S, C)
    check_layer(m, randn(rng, B, T, C), memory=memory)
    projected = m.project_memory(memory)
    for x in (randn(rng, B, T, C), randn(rng, B, T, C)):
        y = m(x, memory=projected)
        (ref, _), (base, _) = torch_results(m, True, x, memory)
        check_against_torch(y, base, ref)


def test_cross_attention_padding(rng):
    C, H, B, T, S = 40, 5, 3, 7, 31
    m, memory = make_layer(rng, C, H), randn(rng, B, S, C)
    check_layer(m, randn(rng, B, T, C), memory=memory, kv_lengths=[S, 1, 12])
    check_layer(m, randn(rng, B, T, C), memory=memory, kv_lengths=[3, S, 20], projected=True)


MASK_FORMS = {"[T,S]": (13, 21), "[B,1,T,S]": (2, 1, 13, 21), "[1,H,T,S]": (1, 5, 13, 21),
              "[B,H,T,S]": (2, 5, 13, 21)}


@pytest.mark.parametrize("kind", ["float", "bool"])
@pytest.mark.parametrize("form", MASK_FORMS.values(), ids=MASK_FORMS.keys())
def test_attn_mask(rng, form, kind):
    """Cross-attention (T=13, S=21) with a mask that leaves every row key 0 (torch gives NaN else)."""
    C, H, B, T, S = 40, 5, 2, 13, 21
    if kind == "bool":
        mask = rng.random(form) < 0.7
        mask[..., 0] = True
    else:
        mask = 2 * randn(rng, *form)
        mask[rng.random(form) < 0.2] = -np.inf
        mask[..., 0] = 0.0
    check_layer(make_layer(rng, C, H), randn(rng, B, T, C), memory=randn(rng, B, S, C), attn_mask=mask)


def test_non_contiguous_inputs(rng):
    C, H, B, T, S = 40, 5, 2, 11, 17
    m = make_layer(rng, C, H)
    x = randn(rng, B, C, T).transpose(0, 2, 1)  # channels strided
    memory = randn(rng, B, S, C)[:, ::-1]       # tokens reversed
    check_layer(m, x, causal=True)
    check_layer(m, x, memory=memory)
    check_layer(m, x[:, ::2], memory=memory, projected=True)


@pytest.mark.parametrize("cross", [False, True], ids=["self-causal", "cross-padded"])
def test_need_weights(rng, cross):
    C, H, B, T = 40, 5, 2, 13
    S = 29 if cross else T
    m, x = make_layer(rng, C, H), randn(rng, B, T, C)
    memory = randn(rng, B, S, C) if cross else None
    options = {"kv_lengths": [S, 6]} if cross else {"causal": True}
    y, weights = m(x, memory=memory, is_causal=options.get("causal", False), kv_lengths=options.get("kv_lengths"),
                   need_weights=True)
    (ref, ref_w), (base, base_w) = torch_results(m, True, x, memory, need_weights=True, **options)
    assert weights.shape == (B, H, T, S)
    check_against_torch(y, base, ref)
    check_against_torch(weights, base_w, ref_w)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_no_bias(rng, causal):
    C, H = 96, 4
    m = make_layer(rng, C, H, bias=False)
    check_layer(m, randn(rng, 2, 33, C), causal=causal, bias=False)
    check_layer(m, randn(rng, 2, 5, C), memory=randn(rng, 2, 17, C), bias=False)


GQA_LAYERS = {"C96-H6-Hkv2": (96, 6, 2), "C96-H6-Hkv3": (96, 6, 3), "C40-H4-Hkv1": (40, 4, 1)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layer", GQA_LAYERS.values(), ids=GQA_LAYERS.keys())
def test_grouped_query_layer(rng, layer, causal):
    C, H, Hkv = layer
    B, T, S = 2, 97, 33
    m = make_layer(rng, C, H, num_kv_heads=Hkv)
    assert m.w_qkv.shape == (C, C + 2 * Hkv * C // H) and m.num_kv_heads == Hkv
    x, memory = randn(rng, B, T, C), randn(rng, B, S, C)
    check_reference(m(x, is_causal=causal, kv_lengths=[T, 40]), m, x, causal=causal, kv_lengths=[T, 40])
    check_reference(m(x, memory=memory, kv_lengths=[S, 5]), m, x, memory, kv_lengths=[S, 5])


DECODERS = {"C40-H5": (40, 5, None), "C96-H6-Hkv2": (96, 6, 2)}


def decode(m, x, cache, chunk):
    """Feeds x [B, T, C] to step() `chunk` tokens at a time; checks the cache length as it grows."""
    start, ys = cache.length, []
    for t in range(0, x.shape[1], chunk):
        ys.append(m.step(x[:, t:t + chunk], cache))
        assert cache.length == start + min(t + chunk, x.shape[1])
    return np.concatenate(ys, axis=1)


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("layer", DECODERS.values(), ids=DECODERS.keys())
def test_step_matches_causal_forward(rng, layer, chunk):
    C, H, Hkv = layer
    B, T = 2, 97
    m, x = make_layer(rng, C, H, num_kv_heads=Hkv), randn(rng, B, T, C)
    cache = m.new_cache(B, T)
    assert cache.length == 0
    check_reference(decode(m, x, cache, chunk), m, x, causal=True)
    check_reference(m(x, is_causal=True), m, x, causal=True)


def test_cache_reset(rng):
    C, H, B, T = 40, 5, 2, 10
    m = make_layer(rng, C, H)
    cache = m.new_cache(B, T)
    decode(m, randn(rng, B, T, C), cache, 3)
    cache.reset()
    assert cache.length == 0
    x = randn(rng, B, T, C)
    check_reference(decode(m, x, cache, 4), m, x, causal=True)
    assert cache.length == T


def test_empty_sequence(rng):
    """T = 0 gives an empty y, for a forward and a step (which leaves the cache as it was)."""
    C, H, B = 12, 4, 2
    m = make_layer(rng, C, H)
    assert m(randn(rng, B, 0, C)).shape == (B, 0, C)
    cache = m.new_cache(B, 4)
    assert m.step(randn(rng, B, 0, C), cache).shape == (B, 0, C)
    assert cache.length == 0


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_nan_token_gives_nan_not_the_bias(rng, cross):
    """A NaN in one token's embedding gives NaN where torch.nn.MultiheadAttention does: in
    cross-attention only that token's output (its query is NaN; it used to come out as b_o, the
    row taken for a fully masked one); in causal self-attention that token and the later ones."""
    C, H, T = 40, 5, 9
    m = make_layer(rng, C, H)
    x = randn(rng, 1, T, C)
    x[0, 4, 7] = np.nan
    memory = randn(rng, 1, 13, C) if cross else None
    y = m(x, memory=memory, is_causal=not cross)
    (ref, _), _ = torch_results(m, True, x, memory, causal=not cross)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref.numpy()))
    assert np.isnan(y[0, 4]).all()
