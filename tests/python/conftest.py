"""Shared fixtures and helpers for the mhsa Python tests.

- MHSA_PYTHONPATH (optional) names the build's python directory; otherwise PYTHONPATH must.
- The `rng` fixture seeds NumPy from MHSA_TEST_SEED, or from a fresh random seed; a failing
  test's report carries the line "reproduce with MHSA_TEST_SEED=<seed>".
- The acceptance bar (check_against_torch): fp32 agreement within 1e-5 relative (L2) with the
  float64 result, and no worse than 2x PyTorch's own fp32 error against it.
- torch_attention: plain attention in torch, in whatever dtype it is given, the float64 oracle;
  visible_keys: the keys the causal limit and kv_lengths leave, as its bias.
"""

import math
import os
import secrets
import sys

import numpy as np
import pytest
import torch

if os.environ.get("MHSA_PYTHONPATH"):
    sys.path.insert(0, os.environ["MHSA_PYTHONPATH"])

# Tests that run the CLI without --model exercise its mechanics (streaming, options, errors): they
# run the small byte-level model mhsa trained itself ("kjv", models/default), which answers in
# milliseconds. test_smollm2.py runs the real default model, with MHSA_MODEL removed.
os.environ.setdefault("MHSA_MODEL", "kjv")

SEED_KEY = "MHSA_TEST_SEED"


@pytest.fixture
def rng(request):
    seed = int(os.environ.get(SEED_KEY) or secrets.randbits(32))
    request.node.user_properties.append((SEED_KEY, seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        for key, seed in item.user_properties:
            if key == SEED_KEY:
                report.sections.append(("mhsa seed", f"reproduce with {SEED_KEY}={seed}"))


def as_f64(a):
    """A NumPy float64 copy of an array or tensor."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def rel_l2(a, ref):
    """||a - ref|| / ||ref|| in float64 (the absolute error when ref is all zeros)."""
    a, ref = as_f64(a), as_f64(ref)
    assert a.shape == ref.shape, f"shape {a.shape} != reference shape {ref.shape}"
    err, norm = np.linalg.norm(a - ref), np.linalg.norm(ref)
    return float(err / norm) if norm > 0 else float(err)


def check_against_torch(ours, torch32, ref64, floor=1e-7):
    """The acceptance bar: ours (fp32) against the float64 reference, absolutely and relative to
    PyTorch's own fp32 error. The 1e-7 floor (about one fp32 rounding, 2^-24 = 6e-8) only
    matters when torch's error is ~0, as when every row attends to a single key and torch returns
    v exactly: it then lets ours be off by one rounding instead of demanding bitwise equality."""
    ours_err, torch_err = rel_l2(ours, ref64), rel_l2(torch32, ref64)
    assert np.isfinite(as_f64(ours)).all(), "non-finite values in the result"
    assert ours_err <= 1e-5, f"rel L2 error {ours_err:.3g} > 1e-5 (torch fp32: {torch_err:.3g})"
    assert ours_err <= 2 * max(torch_err, floor), (
        f"rel L2 error {ours_err:.3g} > 2x torch fp32's {torch_err:.3g}")


def torch_attention(q, k, v, scale, bias=None):
    """Plain attention: q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], additive bias
    broadcastable to [B, Hq, Tq, Tk] (-inf removes a key). Query head h reads kv head
    h // (Hq // Hkv). Rows with no visible key give out 0, lse -inf and probabilities 0.
    Returns (out [B, Hq, Tq, Dv], lse [B, Hq, Tq], probs [B, Hq, Tq, Tk])."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    row_lse = torch.where(torch.isfinite(lse), lse, 0)[..., None]  # masked row: exp(-inf - 0) = 0
    probs = torch.exp(scores - row_lse)
    return probs @ v, lse, probs


def visible_keys(B, Tq, Tk, causal=False, kv_lengths=None):
    """Bool [B, 1, Tq, Tk]: keys left by the causal limit (j <= i + Tk - Tq) and kv_lengths."""
    i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
    visible = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if causal:
        visible &= j <= i + (Tk - Tq)
    if kv_lengths is not None:
        visible &= j < torch.as_tensor(np.asarray(kv_lengths)).view(B, 1, 1, 1)
    return visible


def key_bias(visible, dtype=torch.float64):
    """Visible keys as an additive bias: 0 where visible, -inf elsewhere."""
    return torch.where(visible, 0.0, -math.inf).to(dtype)
