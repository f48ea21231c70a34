"""The model families' row kernels against PyTorch float64 autograd (RMSNorm, LayerNorm backward,
SwiGLU, GeGLU, logit soft-capping, rotary embedding; forward and backward), and the rotary
tables against transformers (the inverse frequencies of ROPE_INIT_FUNCTIONS and the cos/sin of
LlamaRotaryEmbedding, float32, for the default, "linear" and "llama3" scalings).

These kernels have no Python binding: the test writes fresh random inputs to a temporary
safetensors file, runs the C++ test binary's KernelsFromFile.Run on it (every ISA the machine has)
and compares the results that run writes back. The bar is conftest's check_against_torch.
Run with MHSA_TESTS naming the C++ test binary (default: build/tests/mhsa_tests).
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file, save_file

from conftest import check_against_torch, rel_l2

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(os.environ.get("MHSA_TESTS", ROOT / "build" / "tests" / "mhsa_tests"))

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half  # noqa: E402

ROPE = {  # name: (rope_theta, rope_scaling or None, partial_rotary_factor)
    "default": (10000.0, None, 1.0),
    "partial": (10000.0, {"rope_type": "linear", "factor": 1.0}, 0.5),
    "linear": (100000.0, {"rope_type": "linear", "factor": 4.0}, 1.0),
    "llama3": (500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}, 1.0),
}
HEADS, HEAD_DIM = 5, 64  # q and k heads side by side in one row


def run_kernels(tmp_path, inputs, metadata):
    """Writes the inputs, runs every kernel on every ISA in C++, returns {name: array}."""
    if not TESTS.exists():
        pytest.skip(f"no C++ test binary at {TESTS} (set MHSA_TESTS)")
    cases, results = tmp_path / "cases.safetensors", tmp_path / "results.safetensors"
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in inputs.items()}, str(cases),
              metadata={k: str(v) for k, v in metadata.items()})
    env = dict(os.environ, MHSA_KERNEL_CASES=str(cases), MHSA_KERNEL_RESULTS=str(results))
    proc = subprocess.run([str(TESTS), "--gtest_filter=KernelsFromFile.Run"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and results.exists(), proc.stdout + proc.stderr
    return load_file(str(results))


def autograd(fn, inputs, dout, dtype):
    """fn(*inputs) in dtype, and the gradients of <fn, dout> with respect to every input."""
    ts = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in inputs]
    y = fn(*ts)
    y.backward(torch.tensor(dout, dtype=dtype))
    return [y.detach()] + [t.grad for t in ts]


def rope_config(name):
    theta, scaling, partial = ROPE[name]
    return LlamaConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, head_dim=HEAD_DIM, rope_theta=theta,
                       rope_scaling=scaling, partial_rotary_factor=partial, max_position_embeddings=131072)


def transformers_inv_freq(name):
    config = rope_config(name)
    scaling = ROPE[name][1]
    if scaling is None:
        return LlamaRotaryEmbedding(config).inv_freq
    return ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config)[0]


def inv_freq_f64(name, rotary_dim):
    """transformers' formulas (default, linear, llama3) evaluated in float64."""
    theta, scaling, _ = ROPE[name]
    f = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    kind = (scaling or {}).get("rope_type")
    if kind == "linear":
        f = f / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / f
        scaled = np.where(wavelen > old / low, f / factor, f)
        smooth = (old / wavelen - low) / (high - low)
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        f = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return f


@pytest.mark.parametrize("rope", list(ROPE))
def test_kernels_match_torch(tmp_path, rng, rope):
    theta, scaling, partial = ROPE[rope]
    rotary_dim = int(HEAD_DIM * partial)
    R, C, Rl, Cl, Rg, Fg, Rs, Ns, Rr = 37, 577, 29, 771, 19, 1537, 7, 2053, 23
    offset = 1.0 if rope in ("llama3", "partial") else 0.0  # Gemma's (1 + weight) on two of the four runs
    randn = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(np.float32)  # noqa: E731
    x_ln = randn(Rl, Cl) + 3.0  # a mean far from 0
    positions = rng.integers(0, 20000, Rr)  # per-row positions, past llama3's original context
    inputs = {
        "rms.x": randn(R, C, s=2.0), "rms.w": randn(C, s=0.5), "rms.dy": randn(R, C),
        "ln.x": x_ln, "ln.g": randn(Cl, s=0.5), "ln.dy": randn(Rl, Cl),
        "glu.gate": randn(Rg, Fg, s=3.0), "glu.up": randn(Rg, Fg), "glu.dout": randn(Rg, Fg),
        "softcap.x": randn(Rs, Ns, s=40.0), "softcap.dy": randn(Rs, Ns),
        "rope.x": randn(Rr, HEADS, HEAD_DIM), "rope.dy": randn(Rr, HEADS, HEAD_DIM),
        "rope.pos": positions.astype(np.float32),
    }
    s = scaling or {}
    metadata = {"rms.offset": offset, "rms.eps": 1e-6, "ln.eps": 1e-5, "softcap.cap": 30.0,
                "rope.rotary_dim": rotary_dim, "rope.theta": theta, "rope.scaling": s.get("rope_type", "none"),
                "rope.factor": s.get("factor", 1.0), "rope.low_freq_factor": s.get("low_freq_factor", 1.0),
                "rope.high_freq_factor": s.get("high_freq_factor", 4.0),
                "rope.original_max_position_embeddings": s.get("original_max_position_embeddings", 8192)}
    got = run_kernels(tmp_path, inputs, metadata)
    isas = sorted({k.split(".")[0] for k in got if k.count(".") == 2})
    assert "portable" in isas

    def compare(prefix, names, fn, args, dout):
        want64 = autograd(fn, [inputs[a] for a in args], dout, torch.float64)
        want32 = autograd(fn, [inputs[a] for a in args], dout, torch.float32)
        for isa in isas:
            for name, w64, w32 in zip(names, want64, want32):
                if name:
                    check_against_torch(got[f"{isa}.{prefix}.{name}"], w32, w64)

    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (w + offset)  # noqa: E731
    compare("rms", ["y", "dx", "dw"], rms, ["rms.x", "rms.w"], inputs["rms.dy"])
    ln = lambda x, g: F.layer_norm(x, (Cl,), g, torch.zeros_like(g), 1e-5)  # noqa: E731
    # db = Σ dy: the bias only appears in the gradient, so it is compared on its own.
    compare("ln", [None, "dx", "dg"], ln, ["ln.x", "ln.g"], inputs["ln.dy"])
    for isa in isas:
        db64 = inputs["ln.dy"].astype(np.float64).sum(0)
        check_against_torch(got[f"{isa}.ln.db"], torch.tensor(inputs["ln.dy"]).sum(0), db64)
    compare("swiglu", ["out", "dgate", "dup"], lambda g, u: F.silu(g) * u, ["glu.gate", "glu.up"], inputs["glu.dout"])
    compare("geglu", ["out", "dgate", "dup"], lambda g, u: F.gelu(g, approximate="tanh") * u, ["glu.gate", "glu.up"],
            inputs["glu.dout"])
    compare("softcap", ["y", "dx"], lambda x: 30.0 * torch.tanh(x / 30.0), ["softcap.x"], inputs["softcap.dy"])

    # Rotary: the inverse frequencies as transformers computes them in float32 (to an ulp: torch's
    # pow is not correctly rounded), and against the same formulas in float64.
    ours_f = got["rope.inv_freq"]
    hf_f = transformers_inv_freq(rope).numpy()
    assert ours_f.shape == hf_f.shape == (rotary_dim // 2,)
    np.testing.assert_allclose(ours_f, hf_f, rtol=2.5e-7, atol=0)
    check_against_torch(ours_f, hf_f, inv_freq_f64(rope, rotary_dim))
    # The cos/sin table against LlamaRotaryEmbedding's (its angles: the float32 product pos·f).
    rotary = LlamaRotaryEmbedding(rope_config(rope))
    rotary.inv_freq = torch.tensor(hf_f)
    pos = torch.tensor(positions)[None]
    cos32, sin32 = (t[0] for t in rotary(torch.zeros(1, dtype=torch.float32), pos))
    half = rotary_dim // 2
    table = got["rope.table"][positions]
    np.testing.assert_allclose(table[:, :half], cos32[:, :half], rtol=0, atol=2e-6)
    np.testing.assert_allclose(table[:, half:], sin32[:, :half], rtol=0, atol=2e-6)
    # The rotation (q and k heads alike), forward and backward, against torch: float32 with
    # transformers' cos/sin, float64 with cos/sin of transformers' own float32 angles.
    angle = torch.tensor(positions, dtype=torch.float32)[:, None] * torch.tensor(hf_f)
    angle64 = torch.cat([angle, angle], -1).double()

    def rotate(x, cos, sin):  # x [rows, heads, D]: the first rotary_dim dims rotated (rotate_half)
        r, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        return torch.cat([r * cos[:, None] + rotate_half(r) * sin[:, None], rest], -1)

    want32 = autograd(lambda x: rotate(x, cos32, sin32), [inputs["rope.x"]], inputs["rope.dy"], torch.float32)
    want64 = autograd(lambda x: rotate(x, angle64.cos(), angle64.sin()), [inputs["rope.x"]], inputs["rope.dy"],
                      torch.float64)
    for isa in isas:
        check_against_torch(got[f"{isa}.rope.y"], want32[0], want64[0])
        check_against_torch(got[f"{isa}.rope.dx"], want32[1], want64[1])
        assert rel_l2(got[f"{isa}.rope.y"][..., rotary_dim:], inputs["rope.x"][..., rotary_dim:]) == 0
