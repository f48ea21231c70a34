"""The 8-bit KV cache (q8_0) from Python and the CLI. Attention over keys and values stored as a
q8_0 cache stores them (mhsa.scaled_dot_product_attention(..., kv_dtype="q8_0"), keys and values
apart with "q8_0/f16"): the blocks ggml's reference quantiser makes, recomputed here in NumPy,
then PyTorch's attention on the dequantised keys and values as the oracle, on odd sizes (T = 1, 97,
1025; D = 64, 96, 128; grouped heads; causal, window, padding, additive masks), held to the fp32
acceptance bar; Model.load/Model.random(kv_dtype="q8_0"): logits within the quantisation's bound of
the float32 cache's and greedy tokens mostly equal; head sizes not a multiple of 32 refused by
name; `--kv-dtype q8_0`, `--kv-dtype-k/-v` on `mhsa generate` and `mhsa serve` (a q8_0 pool:
17/64 of float32's bytes per block, and a completion equal to `mhsa generate`'s)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa
from conftest import check_against_torch, key_bias, torch_attention, visible_keys

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import write_gpt2_dir  # noqa: E402

# Head size 32: q8_0 blocks are 32 values of the head dimension.
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 211, "hidden_size": 128,
         "intermediate_size": 77, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256}


def q8_0_dequantised(x):
    """x [..., D] (float32, D a multiple of 32) as a q8_0 cache reads it back: per block of 32,
    d = amax / 127 (float32), q = round-half-away(x · (1/d)), value = f16(d) · q — ggml's reference
    quantiser; a scale that rounds to float16 zero gives zeros."""
    x = np.asarray(x, dtype=np.float32)
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = (np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    y = (b * inv).astype(np.float32)
    q = np.sign(y) * np.floor(np.abs(y) + np.float32(0.5))
    d16 = d.astype(np.float16).astype(np.float32)
    return (d16 * q).astype(np.float32).reshape(x.shape)


CASES = [  # B, Hq, Hkv, Tq, Tk, D, what
    (1, 12, 12, 1, 1025, 64, "causal"),
    (2, 6, 2, 1, 97, 96, "causal"),
    (1, 3, 3, 1, 1, 128, "causal"),
    (1, 8, 2, 5, 1025, 128, "window"),
    (1, 4, 1, 97, 97, 64, "causal"),
    (1, 4, 2, 97, 1025, 96, "window"),
    (2, 4, 2, 11, 97, 32, "lengths"),
    (1, 6, 3, 7, 97, 64, "mask"),
]


@pytest.mark.parametrize("kv_dtype", ["q8_0", "q8_0/f16", "f32/q8_0"])
@pytest.mark.parametrize("B, Hq, Hkv, Tq, Tk, D, what", CASES)
def test_attention_over_q8_0_matches_torch_on_dequantised(rng, kv_dtype, B, Hq, Hkv, Tq, Tk, D, what):
    q = rng.standard_normal((B, Hq, Tq, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32) * 2
    v = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
    key_type, value_type = (kv_dtype.split("/") * 2)[:2]
    stored = {"q8_0": q8_0_dequantised, "f16": lambda a: a.astype(np.float16).astype(np.float32), "f32": lambda a: a}
    kd, vd = stored[key_type](k), stored[value_type](v)
    kwargs, lengths = {}, None
    visible = visible_keys(B, Tq, Tk, causal=what != "lengths" and what != "mask")
    if what == "window":
        kwargs["window"] = (19, -1)
        i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
        visible &= j >= i + (Tk - Tq) - 19
    if what == "lengths":
        lengths = rng.integers(0, Tk + 1, size=B)
        visible = visible_keys(B, Tq, Tk, kv_lengths=lengths)
        kwargs["kv_lengths"] = lengths
    bias = key_bias(visible)
    if what == "mask":
        mask = rng.standard_normal((Tq, Tk)).astype(np.float32)
        mask[rng.random((Tq, Tk)) < 0.2] = -np.inf
        kwargs["attn_mask"] = mask
        bias = torch.from_numpy(mask.astype(np.float64))
    ours = mhsa.scaled_dot_product_attention(q, k, v, is_causal=what in ("causal", "window"), kv_dtype=kv_dtype,
                                             **kwargs)
    scale = 1 / math.sqrt(D)
    t = [torch.from_numpy(a) for a in (q, kd, vd)]
    ref64 = torch_attention(*(a.double() for a in t), scale, bias)[0]
    torch32 = torch_attention(*t, scale, bias.float())[0]
    # A row with no visible key: 0 in all three (torch gives 0 through its masked-row rule).
    check_against_torch(ours, torch32.nan_to_num(), ref64.nan_to_num())


def test_q8_0_attention_refusals():
    q = np.zeros((1, 2, 1, 40), np.float32)
    k = np.zeros((1, 1, 4, 40), np.float32)
    with pytest.raises(mhsa.Error, match=r"head_dim: expected a multiple of 32"):
        mhsa.scaled_dot_product_attention(q, k, k, kv_dtype="q8_0")
    with pytest.raises(mhsa.Error, match=r'kv_dtype: expected "f32", "bf16", "f16" or "q8_0", got \'q4_k\''):
        mhsa.scaled_dot_product_attention(q, k, k, kv_dtype="q4_k")


@pytest.mark.parametrize("kv", ["q8_0", "q8_0/f16"])
def test_decode_over_q8_0_cache_near_f32(rng, kv):
    seed = int(rng.integers(1 << 31))
    m32 = mhsa.Model.random(LLAMA, seed=seed)
    m8 = mhsa.Model.random(LLAMA, seed=seed, kv_dtype=kv)
    assert (m32.kv_dtype, m8.kv_dtype) == ("f32", kv)
    prompt = rng.integers(0, LLAMA["vocab_size"], size=int(rng.integers(30, 60)))
    c32, c8 = m32.new_cache(1, 128), m8.new_cache(1, 128)
    a = m32.extend(c32, prompt[None, :], last_only=True)
    b = m8.extend(c8, prompt[None, :], last_only=True)
    same = 0
    for step in range(16):
        # Each cached value within half a step of its block's max / 127 (u = 2^-8 relative to the
        # block): the logits move by a few u of their scale (tests/cpp/test_kv_q8_0.cpp).
        diff = np.abs(a.astype(np.float64) - b).max()
        assert 0 < diff <= 16 * 2.0**-8 * np.abs(a).max(), (step, diff)
        same += int(np.argmax(a)) == int(np.argmax(b))
        nxt = np.array([[int(np.argmax(a))]])
        a, b = m32.extend(c32, nxt, last_only=True), m8.extend(c8, nxt, last_only=True)
    assert same >= 13
    # generate() makes its caches of the model's kv_dtype.
    got = np.asarray(m8.generate(prompt[None, :], 8, stop_at_eos=False))[0]
    c8 = m8.new_cache(1, 128)
    b = m8.extend(c8, prompt[None, :], last_only=True)
    want = []
    for _ in range(8):
        want.append(int(np.argmax(b)))
        b = m8.extend(c8, np.array([[want[-1]]]), last_only=True)
    assert got[len(prompt):].tolist() == want


def test_q8_0_needs_head_size_multiple_of_32():
    odd = dict(LLAMA, hidden_size=48, num_attention_heads=6)  # head size 8
    m = mhsa.Model.random(odd, kv_dtype="q8_0")
    with pytest.raises(mhsa.Error, match=r"KVCache: head_dim: expected a multiple of 32 .*got 8"):
        m.new_cache(1, 16)


def run(*args, input=None):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=300, input=input)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    # GPT-2 with head size 32 (n_embd 64, 2 heads).
    return write_gpt2_dir(tmp_path_factory.mktemp("gpt2-kv8"), seed=1357, n_embd=64)


def test_cli_kv_dtype_q8_0(gpt2_dir):
    outs = {}
    for args in (["--kv-dtype", "f32"], ["--kv-dtype", "q8_0"], ["--kv-dtype-k", "q8_0"],
                 ["--kv-dtype", "q8_0", "--kv-dtype-v", "f16"], ["--kv-dtype", "q8_0/f16"]):
        r = run("generate", "-t", "1", "--model", gpt2_dir, "--prompt", "The meaning of life is", "-n", "12",
                "--json", *args)
        assert r.returncode == 0, (args, r.stderr)
        outs[" ".join(args)] = json.loads(r.stdout)["tokens"]
    assert outs["--kv-dtype q8_0 --kv-dtype-v f16"] == outs["--kv-dtype q8_0/f16"]
    r = run("generate", "--kv-dtype-v", "q4", "--prompt", "x")
    assert r.returncode == 2 and 'mhsa: error: --kv-dtype-v: expected "f32", "bf16", "f16" or "q8_0"' in r.stderr


def metric(url, name):
    import urllib.request
    with urllib.request.urlopen(url + "/metrics") as r:
        return int(re.search(rf"^{name} (\d+)$", r.read().decode(), re.M).group(1))


def completion(url, model, prompt, n):
    import urllib.request
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["text"]


def test_serve_with_q8_0_pool(gpt2_dir):
    bytes_per_block = {}
    for kv in ("f32", "q8_0"):
        proc = subprocess.Popen([str(CLI), "serve", "-t", "1", "--model", str(gpt2_dir), "--port", "0", "--kv-dtype", kv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            m = re.search(r"listening on (http://[\d.]+:\d+)", proc.stdout.readline())
            assert m, proc.stderr.read()
            url = m.group(1)
            bytes_per_block[kv] = metric(url, "mhsa_kv_block_bytes")
            if kv == "q8_0":
                got = completion(url, gpt2_dir.name, "The meaning of life is", 12)
                r = run("generate", "-t", "1", "--model", gpt2_dir, "--prompt", "The meaning of life is", "-n", "12",
                        "--json", "--kv-dtype", "q8_0")
                assert r.returncode == 0, r.stderr
                assert got == json.loads(r.stdout)["text"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert bytes_per_block["q8_0"] * 64 == bytes_per_block["f32"] * 17


def test_cli_q8_0_refuses_a_head_size_not_a_multiple_of_32(tmp_path):
    d = write_gpt2_dir(tmp_path, seed=3)  # head size 16
    r = run("generate", "--model", d, "--kv-dtype-k", "q8_0", "--prompt", "x")
    assert r.returncode == 2
    assert "mhsa: error: --kv-dtype: q8_0 expects a head size that is a multiple of 32" in r.stderr, r.stderr
    assert "head_dim 16" in r.stderr
