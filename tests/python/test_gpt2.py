"""mhsa.GPT2 against Hugging Face transformers' GPT2LMHeadModel loading the same directory.

Random weights are written by transformers itself (save_pretrained → model.safetensors), for a
tiny config and for the full 124M GPT-2 shape; logits must agree to 1e-4 relative L2 and greedy
generation must give the same tokens.
"""

import json
import re
import struct

import numpy as np
import pytest
import torch

import mhsa

transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file  # noqa: E402


def hf_model(config_kwargs, seed, dtype=None):
    cfg = transformers.GPT2Config(**config_kwargs)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # GPT-2's init leaves biases and LayerNorms trivial: make every parameter count
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name or name.startswith("transformer.ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def save(model, path, dtype=None):
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    return path


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(ids)).logits.float().numpy()


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def assert_same_greedy_tokens(got, want, hf):
    """Greedy continuations [B, T] equal, or parting only where transformers' own logits nearly tie,
    as test_families.py allows: float32 sums in another order may pick the other of two tokens
    within ~1e-6 of each other; both continuations are then right, and differ from there on."""
    assert got.shape[0] == want.shape[0], (got.shape, want.shape)
    for g, w in zip(got, want):
        n = min(len(g), len(w))
        if len(g) == len(w) and (g == w).all():
            continue
        p = int(np.argmax(np.append(g[:n] != w[:n], True)))
        assert p < n, f"the same tokens, different lengths: {g} vs {w}"
        logits = hf_logits(hf, w[None, :p])[0, -1]
        assert logits[w[p]] - logits[g[p]] <= 1e-4 * np.abs(logits).max(), (p, g, w)


TINY = dict(vocab_size=97, n_positions=64, n_embd=48, n_layer=3, n_head=4, bos_token_id=96, eos_token_id=96)


@pytest.mark.parametrize("shape", [dict(TINY), dict(TINY, n_embd=80, n_head=2, n_inner=100, vocab_size=1025)])
def test_tiny_logits_and_greedy_match_transformers(rng, tmp_path, shape):
    seed = int(rng.integers(1 << 31))
    hf = hf_model(shape, seed)
    ours = mhsa.GPT2.load(save(hf, tmp_path))
    V = shape["vocab_size"]
    for B, T in [(1, 1), (2, 19), (1, 64)]:
        ids = rng.integers(0, V, (B, T))
        got = ours.forward(ids)
        assert got.shape == (B, T, V) and got.dtype == np.float32
        assert rel_l2(got, hf_logits(hf, ids)) <= 1e-4
    prompt = rng.integers(0, V - 1, (2, 7))
    want = hf.generate(torch.as_tensor(prompt), max_new_tokens=20, do_sample=False, pad_token_id=V - 1,
                       attention_mask=torch.ones(prompt.shape, dtype=torch.long))
    assert_same_greedy_tokens(ours.generate(prompt, max_new_tokens=20), want.numpy(), hf)


def test_gpt2_small_shape_matches_transformers(rng, tmp_path):
    """The full 124M shape (12 layers, 12 heads of 64, vocabulary 50257, context 1024)."""
    hf = hf_model(dict(), int(rng.integers(1 << 31)))
    ours = mhsa.GPT2.load(save(hf, tmp_path))
    assert ours.config["n_layer"] == 12 and ours.config["vocab_size"] == 50257
    ids = rng.integers(0, 50257, (1, 97))
    assert rel_l2(ours.forward(ids), hf_logits(hf, ids)) <= 1e-4
    prompt = rng.integers(0, 50256, (1, 5))
    want = hf.generate(torch.as_tensor(prompt), max_new_tokens=8, do_sample=False, pad_token_id=50256,
                       attention_mask=torch.ones(prompt.shape, dtype=torch.long))
    assert_same_greedy_tokens(ours.generate(prompt, max_new_tokens=8), want.numpy(), hf)


def test_bare_names_and_buffers_as_on_the_hub(rng, tmp_path):
    """The hub's gpt2 checkpoint names tensors without 'transformer.' and carries attn.bias buffers."""
    hf = hf_model(TINY, int(rng.integers(1 << 31)))
    save(hf, tmp_path / "prefixed")
    tensors = load_file(str(tmp_path / "prefixed" / "model.safetensors"))
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    for layer in range(TINY["n_layer"]):
        bare[f"h.{layer}.attn.bias"] = np.tril(np.ones((64, 64), np.float32))[None, None]
    (tmp_path / "bare").mkdir()
    save_file(bare, str(tmp_path / "bare" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "bare" / "config.json").write_text((tmp_path / "prefixed" / "config.json").read_text())
    ids = rng.integers(0, 97, (2, 9))
    want = hf_logits(transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "bare").eval(), ids)
    assert rel_l2(mhsa.GPT2.load(tmp_path / "bare").forward(ids), want) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoints_are_widened(rng, tmp_path, dtype):
    hf = hf_model(TINY, int(rng.integers(1 << 31)))
    save(hf, tmp_path, dtype)
    widened = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    ids = rng.integers(0, 97, (1, 33))
    assert rel_l2(mhsa.GPT2.load(tmp_path).forward(ids), hf_logits(widened, ids)) <= 1e-4


def test_cache_decoding_equals_recomputation(rng, tmp_path):
    ours = mhsa.GPT2.load(save(hf_model(TINY, int(rng.integers(1 << 31))), tmp_path))
    ids = rng.integers(0, 97, (2, 30))
    full = ours.forward(ids)
    cache = ours.new_cache(2, 30)
    steps = [ours.extend(cache, ids[:, :12])] + [ours.extend(cache, ids[:, t:t + 1]) for t in range(12, 30)]
    assert cache.length == 30
    assert rel_l2(np.concatenate(steps, axis=1), full) <= 4e-6
    with pytest.raises(mhsa.Error, match=r"expected at most 0 more tokens"):
        ours.extend(cache, ids[:, :1])


def test_sampling_is_seeded_and_top_k_one_is_greedy(rng, tmp_path):
    ours = mhsa.GPT2.load(save(hf_model(TINY, int(rng.integers(1 << 31))), tmp_path))
    prompt = rng.integers(0, 96, (3, 4))
    a = ours.generate(prompt, 16, temperature=0.9, top_p=0.9, seed=5)
    np.testing.assert_array_equal(a, ours.generate(prompt, 16, temperature=0.9, top_p=0.9, seed=5))
    np.testing.assert_array_equal(ours.generate(prompt, 16, temperature=1.3, top_k=1, seed=3),
                                  ours.generate(prompt, 16))
    # TINY's eos (96) is a token the random model can pick, so a 1-D prompt's continuation may end
    # early; without stop_at_eos it runs all 5 tokens. Either way each token is the greedy one.
    for stop in (False, True):
        one = ours.generate(prompt[0], 5, stop_at_eos=stop)
        assert one.ndim == 1 and (one[:4] == prompt[0]).all()
        n = one.shape[0]
        assert n == 9 or (stop and n >= 5 and one[-1] == 96)
        assert not stop or 96 not in one[4:-1]
        logits = ours.forward(one[None, :-1])[0, 3:]
        chosen = logits[np.arange(n - 4), one[4:]]
        assert (chosen >= logits.max(axis=1) - 1e-4).all()


def test_model_errors_are_clear(tmp_path):
    ours = mhsa.GPT2.random(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(mhsa.Error, match=r"max_new_tokens: expected at most 6 \(the context is 16 tokens"):
        ours.generate(np.zeros((1, 10), np.int64), 7)
    with pytest.raises(mhsa.Error, match=r"ids\[0, 2\]: expected a token id in \[0, 50\), got 50"):
        ours.forward([[1, 2, 50]])
    with pytest.raises(mhsa.Error, match=r"ids: expected integer token ids, got dtype float64"):
        ours.forward(np.zeros((1, 3)))
    with pytest.raises(mhsa.Error, match=r"top_p: expected a value in \(0, 1\]"):
        ours.generate([1, 2], 3, temperature=1.0, top_p=0.0)
    with pytest.raises(mhsa.Error, match=r"config.json: expected a readable config.json, got no such file"):
        mhsa.GPT2.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="llama")))
    with pytest.raises(mhsa.Error, match=r"model_type: expected \"gpt2\", got \"llama\""):
        mhsa.GPT2.load(tmp_path)


def _corrupt(raw, edit=None, length=None, header_bytes=None, data=None):
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    if edit:
        edit(header)
    body = header_bytes if header_bytes is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body + (raw[8 + n:] if data is None else data)


QKV = "transformer.h.0.attn.c_attn.weight"
MODEL_FILE_VARIANTS = {
    "truncated": (lambda raw: raw[:len(raw) // 2], "data_offsets: expected 0 <= begin <= end <="),
    "header-length-too-large": (lambda raw: _corrupt(raw, length=10 ** 9), "header length: expected at most"),
    "out-of-range-offsets": (lambda raw: _corrupt(raw, lambda h: h[QKV].update(data_offsets=[0, 10 ** 12])),
                             f"tensor '{QKV}' data_offsets"),
    "overlapping-offsets": (lambda raw: _corrupt(raw, lambda h: h[QKV].update(
        data_offsets=h[QKV.replace("h.0", "h.1")]["data_offsets"])), "expected bytes apart from tensor"),
    "unknown-dtype": (lambda raw: _corrupt(raw, lambda h: h[QKV].update(dtype="F64")),
                      f"tensor '{QKV}' dtype: expected F32, F16 or BF16, got F64"),
    "shape-size-mismatch": (lambda raw: _corrupt(raw, lambda h: h[QKV].update(shape=[48, 143])),
                            f"tensor '{QKV}' data_offsets: expected"),
    "missing-tensor": (lambda raw: _corrupt(raw, lambda h: h.pop("transformer.h.2.mlp.c_proj.bias")),
                       "expected a tensor 'transformer.h.2.mlp.c_proj.bias', got none"),
    "wrong-shape": (lambda raw: _corrupt(raw, lambda h: h[QKV].update(shape=[144, 48])),
                    f"tensor '{QKV}': expected shape [48, 144], got [144, 48]"),
    "non-utf8-json": (lambda raw: _corrupt(raw, header_bytes=b'{"\xff\xfe": {}}'), "header: expected UTF-8 JSON"),
}


@pytest.mark.parametrize("variant", MODEL_FILE_VARIANTS.values(), ids=MODEL_FILE_VARIANTS.keys())
def test_corrupted_checkpoints_give_clear_errors(rng, tmp_path, variant):
    make, message = variant
    save(hf_model(TINY, int(rng.integers(1 << 31))), tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(make(weights.read_bytes()))
    with pytest.raises(mhsa.Error, match=re.escape(message)):
        mhsa.GPT2.load(tmp_path)
