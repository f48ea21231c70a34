"""mhsa.torch: mhsa's attention as a differentiable, compilable PyTorch op on CPU tensors.

- ``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
  scale=None, enable_gqa=False)``: torch.nn.functional's function with its semantics (top-left
  ``is_causal`` when Tq != Tk, bool and float masks broadcast to ``[..., Hq, Tq, Tk]``, grouped
  query heads with ``enable_gqa``, leading batch dimensions broadcast between q, k and v) for CPU
  float32, bfloat16 and float16 tensors (16-bit ones computed in float32 from their exact values,
  out and gradients rounded to their dtype, as PyTorch's CPU kernels do; bfloat16 needs the
  ml_dtypes package). Strided tensors are read in place. ``dropout_p > 0`` drops probabilities with
  mhsa's counter-based mask, its seed drawn from torch's default generator (so ``torch.manual_seed``
  repeats a run) and kept for the backward, which regenerates the same mask. Anything else (other
  devices or dtypes, a mask that needs a gradient together with dropout) raises
  NotImplementedError; argument errors raise as PyTorch would.
- The ops ``mhsa::sdpa`` (forward: out and lse), ``mhsa::sdpa_backward`` (dq, dk, dv from the
  saved lse) and ``mhsa::sdpa_mask_grad`` (the gradient of a float mask), with fake
  implementations (shapes only) so that ``torch.compile(fullgraph=True)`` traces them, and the
  autograd formula tying them together.
- ``patch()``: routes ``torch.nn.functional.scaled_dot_product_attention`` to mhsa for the calls
  it supports, and to PyTorch's own for the rest. A global switch (``patch()`` / ``unpatch()``)
  and a context manager (``with patch(): ...``).

Not a tensor library: reshapes and broadcasts are torch views; the arithmetic is mhsa's.
"""

import functools
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import _core

__all__ = ["scaled_dot_product_attention", "patch", "unpatch", "is_patched", "supported", "calls"]

_FN = "mhsa.torch.scaled_dot_product_attention"
_ORIGINAL = F.scaled_dot_product_attention

# How many times each op's CPU implementation ran (a test can see that mhsa, not the fallback, ran).
calls = {"forward": 0, "backward": 0, "mask_grad": 0}


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _bfloat16():
    """NumPy's bfloat16 dtype (ml_dtypes), or None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def _numpy(t: torch.Tensor):
    """A NumPy view of a CPU tensor (no copy, strides kept; bfloat16 as ml_dtypes' bfloat16)."""
    t = t.detach()
    return t.view(torch.int16).numpy().view(_bfloat16()) if t.dtype == torch.bfloat16 else t.numpy()


def _torch(a) -> torch.Tensor:
    """The tensor of a NumPy array that mhsa made (no copy)."""
    if a.dtype.itemsize == 2 and a.dtype.name == "bfloat16":
        import numpy as np
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# ---- the ops: q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], mask [B|1, Hq|1, Tq, Tk]


def _dropout(dropout_p: float, seed: Optional[torch.Tensor]) -> dict:
    """The dropout keywords of mhsa's functions: the seed is a 0-d int64 tensor (drawn by torch, so
    that torch.compile traces the draw), read here as the unsigned 64-bit seed mhsa takes."""
    return {} if dropout_p == 0.0 else dict(dropout_p=dropout_p, dropout_seed=int(seed.item()) % 2**64)


@torch.library.custom_op("mhsa::sdpa", mutates_args=(), device_types="cpu")
def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
          is_causal: bool, scale: Optional[float], dropout_p: float,
          seed: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """out [B, Hq, Tq, Dv] and lse [B, Hq, Tq] (causal aligned top-left, as PyTorch)."""
    calls["forward"] += 1
    out, lse = _core.scaled_dot_product_attention(
        _numpy(q), _numpy(k), _numpy(v), None if attn_mask is None else _numpy(attn_mask), is_causal, scale,
        return_lse=True, causal_alignment="top_left", **_dropout(dropout_p, seed))
    return _torch(out), _torch(lse)


@_sdpa.register_fake
def _(q, k, v, attn_mask, is_causal, scale, dropout_p, seed):
    B, Hq, Tq, _ = q.shape
    return q.new_empty((B, Hq, Tq, v.shape[3])), q.new_empty((B, Hq, Tq), dtype=torch.float32)


@torch.library.custom_op("mhsa::sdpa_backward", mutates_args=(), device_types="cpu")
def _sdpa_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
                   scale: Optional[float], dropout_p: float,
                   seed: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from dout and the forward's inputs, out and lse (and its dropout seed)."""
    calls["backward"] += 1
    grads = _core.scaled_dot_product_attention_backward(
        _numpy(dout), _numpy(q), _numpy(k), _numpy(v), _numpy(out), _numpy(lse),
        None if attn_mask is None else _numpy(attn_mask), is_causal, scale, causal_alignment="top_left",
        **_dropout(dropout_p, seed))
    return tuple(_torch(g) for g in grads)


@_sdpa_backward.register_fake
def _(dout, q, k, v, out, lse, attn_mask, is_causal, scale, dropout_p, seed):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.custom_op("mhsa::sdpa_mask_grad", mutates_args=(), device_types="cpu")
def _sdpa_mask_grad(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    attn_mask: torch.Tensor, is_causal: bool, scale: Optional[float]) -> torch.Tensor:
    """The gradient of an additive mask of shape [B|1, Hq|1, Tq, Tk]: dS = P * (dout·vᵀ - rowsum(dout*out)),
    P being mhsa's exact probabilities, summed over the mask's broadcast dimensions. Memory
    B·Hq·Tq·Tk: the size of the scores this gradient is made of."""
    calls["mask_grad"] += 1
    q, k, v, dout, out = (t.detach().float() for t in (q, k, v, dout, out))  # 16-bit ones widened (exact)
    probs = torch.from_numpy(_core.attention_probabilities(
        _numpy(q), _numpy(k), _numpy(attn_mask), is_causal, scale, causal_alignment="top_left"))
    group = q.shape[1] // k.shape[1]
    v_heads = v.repeat_interleave(group, dim=1) if group > 1 else v
    dp = torch.matmul(dout, v_heads.transpose(-1, -2))
    delta = (dout * out).sum(-1, keepdim=True)
    ds = probs.mul_(dp.sub_(delta))
    dims = [d for d in (0, 1) if attn_mask.shape[d] == 1 and ds.shape[d] != 1]
    return ds.sum(dim=dims, keepdim=True) if dims else ds


@_sdpa_mask_grad.register_fake
def _(dout, q, k, v, out, attn_mask, is_causal, scale):
    return attn_mask.new_empty(attn_mask.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, is_causal, scale, dropout_p, seed = inputs
    out, lse = output
    ctx.is_causal, ctx.scale, ctx.dropout_p = is_causal, scale, dropout_p
    ctx.save_for_backward(q, k, v, attn_mask, out, lse, seed)


def _backward(ctx, dout, _dlse):  # lse is never handed to users: its gradient is not used
    q, k, v, attn_mask, out, lse, seed = ctx.saved_tensors
    dq, dk, dv = _sdpa_backward(dout, q, k, v, out, lse, attn_mask, ctx.is_causal, ctx.scale, ctx.dropout_p, seed)
    dmask = None
    if ctx.needs_input_grad[3]:  # never with dropout (_unsupported refuses it)
        dmask = _sdpa_mask_grad(dout, q, k, v, out, attn_mask, ctx.is_causal, ctx.scale)
    return dq, dk, dv, dmask, None, None, None, None


_sdpa.register_autograd(_backward, setup_context=_setup_context)


# ---- PyTorch's calling convention on top of the ops


def _describe(t) -> str:
    return f"a {t.device} {t.dtype} tensor" if isinstance(t, torch.Tensor) else f"an object of type {type(t).__name__}"


def _unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> Optional[str]:
    """Why mhsa does not take this call (None when it does): the cases PyTorch runs and mhsa does not,
    and the ones PyTorch itself refuses (so that the fallback raises PyTorch's own error)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dtype not in _DTYPES:
            return f"{name}: expected a CPU float32, bfloat16 or float16 tensor, got {_describe(t)}"
        if t.dtype != query.dtype:  # PyTorch refuses mixed dtypes: its fallback raises its own error
            return f"{name}: expected dtype {query.dtype} like query, got {t.dtype}"
    if query.dtype == torch.bfloat16 and _bfloat16() is None:
        return "query: expected float32 or float16 without the ml_dtypes package, got a CPU bfloat16 tensor"
        if t.dim() < 3 or t.dim() != query.dim():
            return f"{name}: expected {max(query.dim(), 3)} dimensions [..., H, T, E] like query, got {t.dim()}"
        if t.numel() == 0:
            return f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}"
        if t.is_nested:
            return f"{name}: expected a strided tensor, got a nested one"
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        return f"dropout_p: expected a probability in [0, 1), got {dropout_p!r}"
    if dropout_p > 0.0 and isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad:
        return "attn_mask: expected a mask that needs no gradient with dropout_p > 0, got one that requires grad"
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.device.type != "cpu" or attn_mask.dtype not in (
                torch.float32, torch.bool, query.dtype):
            return f"attn_mask: expected a CPU float32, {query.dtype} or bool tensor, got {_describe(attn_mask)}"
        if is_causal:
            return "attn_mask: expected None with is_causal=True (PyTorch refuses both), got a tensor"
        if attn_mask.dim() > query.dim():
            return f"attn_mask: expected at most {query.dim()} dimensions, got {attn_mask.dim()}"
    Hq, Tq, D = query.shape[-3:]
    Hkv, Tk, Dk = key.shape[-3:]
    if Dk != D or value.shape[-2] != Tk or value.shape[-3] != Hkv:
        return (f"key, value: expected [..., Hkv, Tk, {D}] and [..., Hkv, Tk, Dv], got {tuple(key.shape)} and "
                f"{tuple(value.shape)}")
    if Hq != Hkv and Hkv != 1 and not (enable_gqa and Hq % Hkv == 0):  # one kv head broadcasts, as in PyTorch
        return f"key: expected {Hq} heads, 1, or a divisor of {Hq} with enable_gqa=True, got {Hkv}"
    try:
        batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        if attn_mask is not None:
            torch.broadcast_shapes(attn_mask.shape, (*batch, Hq, Tq, Tk))
    except RuntimeError:
        return (f"shapes: expected batch dimensions that broadcast, got query {tuple(query.shape)}, key "
                f"{tuple(key.shape)}, value {tuple(value.shape)}"
                + ("" if attn_mask is None else f", attn_mask {tuple(attn_mask.shape)}"))
    return None


def supported(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False) -> bool:
    """Whether mhsa runs this call (patch() sends the others to PyTorch)."""
    return _unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) is None


def _as_batch(t: torch.Tensor, batch) -> torch.Tensor:
    """[*batch', H, T, E] -> [B, H, T, E]: broadcast to the common batch dims and flattened (a
    view when the strides allow; one batch dim broadcasts with stride 0)."""
    t = t.expand(*batch, *t.shape[-3:])
    return t.reshape(-1, *t.shape[-3:]) if len(batch) != 1 else t


def _mask_4d(mask: torch.Tensor, batch, Hq: int, Tq: int, Tk: int) -> torch.Tensor:
    """A mask broadcastable to [*batch, Hq, Tq, Tk] as [B|1, Hq|1, Tq, Tk]: size-1 batch and head
    dimensions are kept (mhsa broadcasts them), Tq and Tk are expanded (stride 0, no copy)."""
    mask = mask.reshape((1,) * (len(batch) + 3 - mask.dim()) + tuple(mask.shape))
    lead, heads = mask.shape[:-3], mask.shape[-3]
    if all(n == 1 for n in lead):
        mask = mask.reshape(1, heads, *mask.shape[-2:])
    else:
        mask = mask.expand(*batch, heads, *mask.shape[-2:]).reshape(-1, heads, *mask.shape[-2:])
    return mask.expand(mask.shape[0], heads, Tq, Tk)


def _run(query, key, value, attn_mask, dropout_p, is_causal, scale):
    batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    Hq, Tq, _ = query.shape[-3:]
    Tk = key.shape[-2]
    q, k, v = (_as_batch(t, batch) for t in (query, key, value))
    mask = None
    if attn_mask is not None:  # a 16-bit mask widened (exact; differentiable, its gradient rounded back)
        mask = _mask_4d(attn_mask if attn_mask.dtype in (torch.float32, torch.bool) else attn_mask.float(), batch,
                        Hq, Tq, Tk)
    dropout_p = float(dropout_p)
    seed = torch.randint(-2**63, 2**63 - 1, (), dtype=torch.int64) if dropout_p > 0.0 else None
    out, _ = _sdpa(q, k, v, mask, bool(is_causal), None if scale is None else float(scale), dropout_p, seed)
    return out.reshape(*batch, Hq, Tq, value.shape[-1])


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention computed by mhsa: CPU float32, bfloat16 or
    float16 tensors (NotImplementedError otherwise); differentiable in query, key, value and a float attn_mask (not
    both a mask gradient and dropout); dropout's seed drawn from torch's default generator;
    traceable by torch.compile."""
    why = _unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if why is not None:
        known = ("expected a CPU float32", "without the ml_dtypes", "dropout_p", "expected a non-empty", "expected a strided",
                 "with dropout_p > 0")
        kind = NotImplementedError if any(s in why for s in known) else RuntimeError
        raise kind(f"{_FN}: {why}")
    return _run(query, key, value, attn_mask, dropout_p, is_causal, scale)


@functools.wraps(_ORIGINAL)
def _patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if _unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) is None:
        return _run(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return _ORIGINAL(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                     enable_gqa=enable_gqa)


def is_patched() -> bool:
    """Whether torch.nn.functional.scaled_dot_product_attention is routed to mhsa now."""
    return F.scaled_dot_product_attention is _patched


def _set(enable: bool) -> None:
    F.scaled_dot_product_attention = _patched if enable else _ORIGINAL


class patch:
    """Routes torch.nn.functional.scaled_dot_product_attention to mhsa (CPU float32, bfloat16, float16; PyTorch's own
    for every other call). ``patch()`` switches it on for the process (``unpatch()``
    or ``patch(False)`` off); ``with patch(): ...`` switches it on for the block and then restores
    the state before it. Code that copied the function before the patch keeps PyTorch's."""

    def __init__(self, enable: bool = True):
        self._before = is_patched()
        _set(enable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _set(self._before)
        return False


def unpatch() -> None:
    """Routes torch.nn.functional.scaled_dot_product_attention back to PyTorch's own."""
    _set(False)
