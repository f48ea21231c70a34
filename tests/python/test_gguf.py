"""GGUF in and out: files mhsa writes read by the `gguf` package (llama.cpp's own Python reader) with
the expected types, shapes and values; files written with gguf.GGUFWriter in llama.cpp's layout
(its names, Llama's q/k rows permuted as convert_hf_to_gguf.py permutes them, its metadata) load
in mhsa and give the logits of the same model loaded from safetensors (Llama 3's RoPE scaling as
the converter's rope_freqs tensor included, read and written); the chat template of the metadata
is what `mhsa chat` and `mhsa serve` use; quantised tensors dequantise as gguf dequantises them;
corrupt files give mhsa.Error, never a crash. llama.cpp itself (its converter's output, its greedy
tokens on the same file) is compared in bench/greedy_vs_llama_cpp.py, outside CI.

Models: tiny random Llama (grouped heads) and GPT-2 made with transformers (families.build) and
saved with save_pretrained."""

import json
import math
import os
import re
import resource
import signal
import stat
import struct
import subprocess
import urllib.request
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q

import mhsa
import families
from families import build

MHSA = Path(__file__).resolve().parents[2] / "build" / "mhsa"

LLAMA = (transformers.LlamaConfig, dict(
    vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False), transformers.LlamaForCausalLM)
# Odd widths (rows that are no whole Q8_0 block), biases everywhere, linear RoPE scaling, tied head.
LLAMA_ODD = (transformers.LlamaConfig, dict(
    vocab_size=89, hidden_size=36, intermediate_size=61, num_hidden_layers=2, num_attention_heads=6,
    num_key_value_heads=3, max_position_embeddings=64, tie_word_embeddings=True, attention_bias=True,
    mlp_bias=True, rope_scaling=dict(rope_type="linear", factor=2.5)), transformers.LlamaForCausalLM)
# Llama 3.2's form (tied head, theta 500000, llama3 rope_scaling factor 32, low 1, high 4) made
# small: original_max_position_embeddings 64 puts head_dim 16's frequencies in all three bands
# (kept, smoothed, divided by the factor).
LLAMA3 = (transformers.LlamaConfig, dict(
    vocab_size=103, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
    tie_word_embeddings=True, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=64)),
    transformers.LlamaForCausalLM)
GPT2 = (transformers.GPT2Config, dict(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=48),
        transformers.GPT2LMHeadModel)
# Rows of whole Q4_K blocks (256 values) but down_proj's (288: Q8_0); an untied head.
LLAMA_256 = (transformers.LlamaConfig, dict(
    vocab_size=101, hidden_size=256, intermediate_size=288, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False), transformers.LlamaForCausalLM)
GPT2_256 = (transformers.GPT2Config, dict(vocab_size=97, n_embd=256, n_layer=2, n_head=4, n_positions=48),
            transformers.GPT2LMHeadModel)


def save(case, path, seed=0):
    model = build(*case, seed=seed)
    model.save_pretrained(path)
    return {k: v.numpy() for k, v in model.state_dict().items()}


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate_half rows → interleaved pairs per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LLAMA_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
GPT2_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
              "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
          "transformer.wte": "token_embd", "transformer.wpe": "position_embd", "transformer.ln_f": "output_norm"}


def llama_cpp_tensors(state, cfg, back=None):
    """The state dict as llama.cpp's converter lays it out: gguf name → array. With a dict `back`,
    also gguf name → (Hugging Face name, the function that maps the stored array back)."""
    gpt2 = cfg.model_type == "gpt2"
    out = {}
    back = {} if back is None else back
    for name, w in state.items():
        if name.endswith((".attn.bias", ".attn.masked_bias")) or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        module, _, kind = name.rpartition(".")
        if module in GLOBAL:
            out[f"{GLOBAL[module]}.{kind}"] = w
            back[f"{GLOBAL[module]}.{kind}"] = (name, lambda a: a)
            continue
        parts = module.split(".")
        layer, rest = parts[2], ".".join(parts[3:])
        new = f"blk.{layer}.{(GPT2_NAMES if gpt2 else LLAMA_NAMES)[rest]}.{kind}"
        undo = lambda a: a  # noqa: E731
        if gpt2 and kind == "weight" and rest not in ("ln_1", "ln_2"):
            w, undo = w.T, (lambda a: a.T)
        heads = None if gpt2 else {"self_attn.q_proj": cfg.num_attention_heads,
                                   "self_attn.k_proj": cfg.num_key_value_heads}.get(rest)
        if heads:
            w, undo = permute(w, heads), (lambda a, h=heads: unpermute(a, h))
        out[new] = np.ascontiguousarray(w)
        back[new] = (name, undo)
    return out


def llama3_rope_freqs(cfg):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: llama3 rope_scaling as the
    per-frequency divisors of the rope_freqs tensor (the converter's torch float32 arithmetic)."""
    p = cfg.rope_parameters
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high, old = p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def write_llama_cpp_file(path, state, cfg, qtype=None, metadata=None, add=None):
    """A GGUF file as llama.cpp's converter writes one, through the gguf package's writer;
    metadata(writer) adds more keys; add(writer, name, array) stores each tensor instead of the
    default (F32, or qtype for matrices)."""
    gpt2 = cfg.model_type == "gpt2"
    w = gguf.GGUFWriter(str(path), "gpt2" if gpt2 else "llama")
    if gpt2:
        w.add_block_count(cfg.n_layer)
        w.add_context_length(cfg.n_positions)
        w.add_embedding_length(cfg.n_embd)
        w.add_feed_forward_length(4 * cfg.n_embd)
        w.add_head_count(cfg.n_head)
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    else:
        w.add_block_count(cfg.num_hidden_layers)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        if cfg.rope_parameters.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg.rope_parameters["factor"])
        if cfg.rope_parameters.get("rope_type") == "llama3":  # no scaling key: a tensor
            w.add_tensor("rope_freqs.weight", llama3_rope_freqs(cfg))
    if metadata:
        metadata(w)
    for name, t in llama_cpp_tensors(state, cfg).items():
        t = t.astype(np.float32)
        if add is not None:
            add(w, name, t)
        elif qtype is not None and t.ndim == 2 and t.shape[-1] % 32 == 0 and name != "position_embd.weight":
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("case", [LLAMA, LLAMA_ODD, GPT2], ids=["llama_gqa", "llama_odd_bias", "gpt2"])
def test_llama_cpp_layout_loads_with_the_same_logits(case, rng, tmp_path):
    state = save(case, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    write_llama_cpp_file(tmp_path / "m.gguf", state, cfg)
    ours, ref = mhsa.Model.load(tmp_path / "m.gguf"), mhsa.Model.load(tmp_path / "hf")
    got, want = mhsa.read_gguf_config(tmp_path / "m.gguf"), mhsa.read_model_config(tmp_path / "hf")
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "max_positions", "norm", "rope_theta", "rope_scaling", "qkv_bias",
                "o_bias", "mlp_bias", "tie_word_embeddings"):
        assert got[key] == pytest.approx(want[key]), key
    ids = rng.integers(0, cfg.vocab_size, (2, 11)).astype(np.int32)
    np.testing.assert_array_equal(ours.forward(ids), ref.forward(ids))
    bf16 = [mhsa.Model.load(p, dtype="bf16").forward(ids) for p in (tmp_path / "m.gguf", tmp_path / "hf")]
    np.testing.assert_array_equal(bf16[0], bf16[1])


def rel_l2(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(np.asarray(b, np.float64)))


def test_llama3_rope_freqs_load(rng, tmp_path):
    """Llama 3's RoPE scaling as llama.cpp's converter stores it (no scaling key; a rope_freqs tensor
    of per-frequency divisors) runs as the llama3 config does in mhsa (the same frequencies up to
    float32 rounding: not bitwise)."""
    state = save(LLAMA3, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    write_llama_cpp_file(tmp_path / "m.gguf", state, cfg)
    rope = mhsa.read_gguf_config(tmp_path / "m.gguf")["rope_scaling"]
    want = llama3_rope_freqs(cfg)
    assert rope["kind"] == "factors" and len(set(want.tolist())) > 2  # all three bands
    np.testing.assert_array_equal(np.float32(rope["factors"]), want)
    ids = rng.integers(0, cfg.vocab_size, (1, int(rng.integers(60, 120)))).astype(np.int32)
    ours, ref = mhsa.Model.load(tmp_path / "m.gguf").forward(ids), mhsa.Model.load(tmp_path / "hf").forward(ids)
    assert rel_l2(ours, ref) < 1e-5
    plain = json.loads((tmp_path / "hf" / "config.json").read_text())
    plain.pop("rope_scaling", None)
    plain.pop("rope_parameters", None)
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**plain, "rope_theta": 500000.0}))
    assert rel_l2(mhsa.Model.load(tmp_path / "hf").forward(ids), ref) > 1e-3  # the factors matter here


def test_llama3_config_is_written_as_rope_freqs(rng, tmp_path):
    save(LLAMA3, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    out = tmp_path / "q.gguf"
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", "f32", "--out", out)
    assert r.returncode == 0, r.stderr
    reader = gguf.GGUFReader(str(out))
    assert not any("rope.scaling" in k for k in reader.fields)
    written = {t.name: t for t in reader.tensors}["rope_freqs.weight"]
    np.testing.assert_allclose(np.asarray(written.data), llama3_rope_freqs(cfg), rtol=2e-7)
    ids = rng.integers(0, cfg.vocab_size, (1, 77)).astype(np.int32)
    assert rel_l2(mhsa.Model.load(out).forward(ids), mhsa.Model.load(tmp_path / "hf").forward(ids)) < 1e-5


def test_bad_rope_freqs_are_refused(rng, tmp_path):
    state = save(LLAMA3, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    good = llama3_rope_freqs(cfg)
    for factors, words in ((good[:-1], "rope_freqs.weight' dims"), (np.where(np.arange(8) == 3, -1, good), "> 0"),
                           (np.where(np.arange(8) == 5, np.inf, good), "finite")):
        w_cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
        w_cfg.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
        write_llama_cpp_file(tmp_path / "bad.gguf", state, w_cfg,
                             metadata=lambda w: w.add_tensor("rope_freqs.weight", factors.astype(np.float32)))
        with pytest.raises(mhsa.Error, match=re.escape(words)):
            mhsa.Model.load(tmp_path / "bad.gguf")


def test_quantised_tensors_dequantise_as_gguf_does(rng, tmp_path):
    state = save(LLAMA, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        path = tmp_path / f"{qtype.name}.gguf"
        write_llama_cpp_file(path, state, cfg, qtype)
        reader = gguf.GGUFReader(str(path))
        model = mhsa.model_parameters(mhsa.Model.load(path))
        for t in reader.tensors:
            if t.tensor_type != qtype:
                continue
            want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            ours = mhsa.read_gguf(path)["tensors"][t.name]
            np.testing.assert_array_equal(ours, want, err_msg=t.name)
        # The model's weights are the dequantised ones, q/k permutation undone.
        q = gguf.quants.dequantize(reader.tensors[[t.name for t in reader.tensors].index("blk.1.attn_k.weight")].data, qtype)
        np.testing.assert_array_equal(model["model.layers.1.self_attn.k_proj.weight"], unpermute(q, cfg.num_key_value_heads))


# The k-quant super-blocks: bytes per 256 values, and where their f16 scales lie.
K_QUANTS = {Q.Q4_K: (144, [0, 2]), Q.Q5_K: (176, [0, 2]), Q.Q6_K: (210, [208])}


@pytest.mark.parametrize("qtype", list(K_QUANTS), ids=lambda q: q.name)
def test_k_quant_blocks_dequantise_as_gguf_does(qtype, rng, tmp_path):
    """Random super-blocks (every quant, scale and high bit drawn; finite f16 scales) read by mhsa
    as the gguf package dequantises them: llama.cpp's Q4_K_M/Q5_K_M files mix Q5_K and Q6_K in."""
    size, scale_at = K_QUANTS[qtype]
    blocks = rng.integers(0, 256, (3, 5, size), dtype=np.uint8)
    for at in scale_at:
        blocks[..., at:at + 2] = rng.uniform(-2, 2, (3, 5, 1)).astype(np.float16).view(np.uint8)
    raw = blocks.reshape(3, 5 * size)
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    w.add_tensor("x", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = mhsa.read_gguf(tmp_path / "k.gguf")
    assert got["types"]["x"] == qtype.name and got["shapes"]["x"] == [3, 5 * 256]
    np.testing.assert_array_equal(got["tensors"]["x"], gguf.quants.dequantize(raw, qtype).astype(np.float32))


def test_a_q4_k_m_style_mix_loads(rng, tmp_path):
    """llama.cpp's Q4_K_M keeps most matrices Q4_K and some (attn_v, ffn_down, output) Q6_K, or
    Q5_0 where a row is not whole super-blocks. Such a file loads with those matrices dequantised
    exactly (float32), and as a q4_k model (its Q4_K matrices as stored) near the float32 logits."""
    state = save(LLAMA_256, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    mhsa.save_gguf(mhsa.Model.load(tmp_path / "hf"), tmp_path / "q4.gguf", "q4_k")  # our Q4_K blocks to reuse
    q4_k = {t.name: t.data for t in gguf.GGUFReader(str(tmp_path / "q4.gguf")).tensors if t.tensor_type == Q.Q4_K}
    path = tmp_path / "mix.gguf"
    types = {}

    def add(w, name, t):
        if t.ndim != 2:
            w.add_tensor(name, t)
            return
        # Q6_K blocks of random bytes with small scales stand in for llama.cpp's quantiser (the
        # gguf package has none for Q6_K); Q4_K blocks are our own, the others the package's.
        qtype = (Q.Q6_K if "attn_v" in name or name == "output.weight" else
                 Q.Q5_0 if "ffn_down" in name else Q.Q4_K if name in q4_k else Q.Q8_0)  # 288 columns: no k-quant
        if qtype == Q.Q6_K:
            raw = rng.integers(0, 256, (t.shape[0], t.shape[1] // 256 * 210), dtype=np.uint8)
            blocks = raw.reshape(t.shape[0], -1, 210)
            blocks[..., 208:210] = rng.uniform(1e-4, 1e-3, blocks.shape[:2] + (1,)).astype(np.float16).view(np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)
        elif qtype == Q.Q4_K:
            w.add_tensor(name, q4_k[name], raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        types[name] = qtype

    write_llama_cpp_file(path, state, cfg, add=add)
    reader = gguf.GGUFReader(str(path))
    assert {t.name: t.tensor_type for t in reader.tensors if t.name in types} == types
    assert Q.Q4_K in types.values()
    f32 = mhsa.Model.load(path)
    params = mhsa.model_parameters(f32)
    stored = {t.name: t for t in reader.tensors}
    np.testing.assert_array_equal(params["model.layers.1.mlp.down_proj.weight"],
                                  gguf.quants.dequantize(stored["blk.1.ffn_down.weight"].data, Q.Q5_0))
    np.testing.assert_array_equal(params["lm_head.weight"], gguf.quants.dequantize(stored["output.weight"].data, Q.Q6_K))
    np.testing.assert_array_equal(params["model.layers.0.self_attn.v_proj.weight"],
                                  gguf.quants.dequantize(stored["blk.0.attn_v.weight"].data, Q.Q6_K))
    q4 = mhsa.Model.load(path, dtype="q4_k")  # its Q4_K matrices as stored, the others quantised again
    ids = rng.integers(0, cfg.vocab_size, 13).tolist()
    want, got = np.asarray(f32.forward(ids)), np.asarray(q4.forward(ids))
    assert np.isfinite(got).all()
    # Q6_K/Q5_0 matrices are requantised to 4 bits (the lm_head to Q8_0): a few percent off.
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.2


def test_save_gguf_writes_q4_k_that_gguf_dequantises_to_our_weights(rng, tmp_path):
    """mhsa.save_gguf(dtype="q4_k"): our own quantiser's blocks, which the gguf package dequantises
    to exactly the weights a q4_k model multiplies by (loaded from the file as float32 here)."""
    state = save(GPT2_256, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    mhsa.save_gguf(mhsa.Model.load(tmp_path / "hf"), tmp_path / "m.gguf", "q4_k")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    back = {}
    expected = llama_cpp_tensors(state, cfg, back)
    ours = mhsa.model_parameters(mhsa.Model.load(tmp_path / "m.gguf"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_qkv.weight"] == Q.Q4_K and types["blk.1.ffn_down.weight"] == Q.Q4_K
    assert types["token_embd.weight"] == Q.Q8_0  # the tied output matrix
    for t in reader.tensors:
        if t.tensor_type != Q.Q4_K:
            continue
        deq = gguf.quants.dequantize(t.data, Q.Q4_K).astype(np.float32).reshape(expected[t.name].shape)
        name, undo = back[t.name]
        np.testing.assert_array_equal(ours[name[len("transformer."):] if name.startswith("transformer.") else name],
                                      undo(deq), err_msg=t.name)
        rel = np.sqrt(np.mean((deq - expected[t.name]) ** 2) / np.mean(expected[t.name] ** 2))
        assert rel < 0.1, (t.name, rel)


def run_cli(*args, **kwargs):
    return subprocess.run([str(MHSA), *map(str, args)], capture_output=True, text=True, **kwargs)


def stored_type(name, shape, to, tied):
    """The type mhsa writes a tensor as: F32 vectors and positions; with q4_k, the output matrix
    (token_embd when tied) and rows of no whole 256-value block Q8_0; Q8_0 rows of no whole block F16
    (llama.cpp's converter's fallback)."""
    if len(shape) == 1 or name == "position_embd.weight":
        return Q.F32
    kind = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_k": Q.Q4_K}[to]
    output = name == "output.weight" or (tied and name == "token_embd.weight")
    if kind == Q.Q4_K and (output or shape[-1] % 256):
        kind = Q.Q8_0
    if kind == Q.Q8_0 and shape[-1] % 32:
        kind = Q.F16
    return kind


@pytest.mark.parametrize("case, to", [(c, t) for c in (LLAMA, LLAMA_ODD, GPT2) for t in ("f32", "f16", "bf16", "q8_0")]
                         + [(LLAMA_256, "q4_k"), (GPT2_256, "q4_k"), (LLAMA_ODD, "q4_k")],
                         ids=[f"{c}-{t}" for c in ("llama_gqa", "llama_odd_bias", "gpt2") for t in ("f32", "f16", "bf16", "q8_0")]
                         + ["llama_256-q4_k", "gpt2_256-q4_k", "llama_odd_bias-q4_k"])
def test_written_files_read_back_in_gguf_and_mhsa(case, to, rng, tmp_path):
    state = save(case, tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    out = tmp_path / "m.gguf"
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", to, "--out", out)
    assert r.returncode == 0, r.stderr
    reader = gguf.GGUFReader(str(out))
    fields = reader.fields
    arch = "gpt2" if cfg.model_type == "gpt2" else "llama"
    assert fields["general.architecture"].contents() == arch
    assert fields[f"{arch}.block_count"].contents() == cfg.num_hidden_layers
    back = {}
    expected = llama_cpp_tensors(state, cfg, back)
    assert {t.name for t in reader.tensors} == set(expected)
    ours = mhsa.model_parameters(mhsa.Model.load(out))
    ref = mhsa.Model.load(tmp_path / "hf")
    tied = "output.weight" not in expected
    for t in reader.tensors:
        want = expected[t.name]
        kind = stored_type(t.name, want.shape, to, tied)
        assert t.tensor_type == kind, t.name
        assert tuple(reversed([int(n) for n in t.shape])) == want.shape, t.name
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(want.shape)
        if kind == Q.F32:
            np.testing.assert_array_equal(deq, want, err_msg=t.name)
        else:
            bound = 0.2 if kind == Q.Q4_K else 0.02  # Q4_K: 15 steps over a sub-block, least squares (not min/max)
            assert np.abs(deq - want).max() <= bound * np.abs(want).max() + 1e-6, t.name
        # gguf's values are the weights mhsa uses, mapped back to Hugging Face's layout.
        name, undo = back[t.name]
        mine = ours[name[len("transformer."):] if name.startswith("transformer.") else name]
        np.testing.assert_array_equal(mine, undo(deq), err_msg=t.name)
    ids = rng.integers(0, cfg.vocab_size, (1, 9)).astype(np.int32)
    if to == "f32":
        np.testing.assert_array_equal(mhsa.Model.load(out).forward(ids), ref.forward(ids))
    if to == "q4_k" and Q.F16 not in {t.tensor_type for t in reader.tensors}:
        # the file's blocks, kept as stored, are the ones quantising at load makes
        kept = mhsa.Model.load(out, dtype="q4_k")
        assert kept.dtype == "q4_k"
        np.testing.assert_array_equal(kept.forward(ids), mhsa.Model.load(tmp_path / "hf", dtype="q4_k").forward(ids))


# OLMo-2's and Phi-3's layers as llama.cpp's tensor map names them: OLMo-2's post norms and q/k
# norms; Phi-3's fused attn_qkv (q, k, v rows) and ffn_up (gate rows, then up rows), as stored.
FAMILY_NAMES = {
    "olmo2": {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "post_feedforward_layernorm": "post_ffw_norm"},
    "phi3": {"input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"},
}
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.mark.parametrize("to", ["f32", "q8_0"])
@pytest.mark.parametrize("family, case", [("olmo2", "olmo2_post_norms"), ("phi3", "phi3_fused")])
def test_olmo2_and_phi3_are_written_in_llama_cpp_names_and_read_back(family, case, to, rng, tmp_path):
    state = save(families.TINY[case], tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    out = tmp_path / "m.gguf"
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", to, "--out", out)
    assert r.returncode == 0, r.stderr
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.architecture"].contents() == family
    expected = {}
    for name, w in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        module, _, kind = name.rpartition(".")
        if module in GLOBAL:
            expected[f"{GLOBAL[module]}.{kind}"] = (name, w)
        else:
            parts = module.split(".")
            expected[f"blk.{parts[2]}.{FAMILY_NAMES[family]['.'.join(parts[3:])]}.{kind}"] = (name, w)
    assert {t.name for t in reader.tensors} == set(expected)
    ours = mhsa.model_parameters(mhsa.Model.load(out))
    for t in reader.tensors:
        name, want = expected[t.name]
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(want.shape)
        if t.tensor_type == Q.F32:
            np.testing.assert_array_equal(deq, want, err_msg=t.name)
        else:
            assert np.abs(deq - want).max() <= 0.02 * np.abs(want).max(), t.name
        # What mhsa loads from the file: gguf's values, a fused tensor in its parts.
        stem, _, leaf = name.rpartition(".")[0].rpartition(".")
        mine = (np.concatenate([ours[f"{stem}.{p}.weight"] for p in FUSED[leaf]]) if leaf in FUSED
                else ours[name])
        np.testing.assert_array_equal(mine, deq, err_msg=t.name)
    if cfg.model_type == "phi3":
        assert reader.fields["phi3.attention.sliding_window"].contents() == cfg.sliding_window
    got, want = mhsa.read_gguf_config(out), mhsa.read_model_config(tmp_path / "hf")
    for key in ("family", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "norm_eps", "qkv_bias",
                "o_bias", "qk_norm", "qk_norm_full_width", "pre_norms", "post_norms", "window_left",
                "tie_word_embeddings"):
        assert got[key] == pytest.approx(want[key]), key
    if to == "f32":
        ids = rng.integers(0, cfg.vocab_size, (2, 11)).astype(np.int32)
        np.testing.assert_array_equal(mhsa.Model.load(out).forward(ids), mhsa.Model.load(tmp_path / "hf").forward(ids))


def test_quantize_refuses_bad_options(rng, tmp_path):
    save(LLAMA, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    assert run_cli("quantize", "--model", tmp_path / "hf", "--to", "f16", "--out", out).returncode == 0
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", "f16", "--out", out)
    assert r.returncode == 2 and "exists" in r.stderr and "--force" in r.stderr
    before = out.read_bytes()
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", "q8_0", "--out", out, "--force")
    assert r.returncode == 0 and out.read_bytes() != before
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", "q5_k", "--out", tmp_path / "x.gguf")
    assert r.returncode == 2 and "--to: expected" in r.stderr and not (tmp_path / "x.gguf").exists()
    r = run_cli("quantize", "--model", tmp_path / "nope", "--to", "f16", "--out", tmp_path / "x.gguf")
    assert r.returncode == 2 and "--model: expected a model directory" in r.stderr
    qwen = build(transformers.Qwen2Config, dict(vocab_size=50, hidden_size=32, intermediate_size=40,
                                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1),
                 transformers.Qwen2ForCausalLM, seed=1)
    qwen.save_pretrained(tmp_path / "qwen")
    r = run_cli("quantize", "--model", tmp_path / "qwen", "--to", "f16", "--out", tmp_path / "x.gguf")
    assert r.returncode == 2 and "a model of a family mapped to GGUF (gpt2, llama" in r.stderr and not (tmp_path / "x.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "m.gguf", "qwen"]  # no temporary left


@pytest.mark.parametrize("kind", ["character device", "FIFO", "directory"])
def test_quantize_never_replaces_a_node_that_is_not_a_file(kind, tmp_path):
    """--force replaced a character device (a copy of /dev/full) with a regular file, exit 0: the
    file is written beside it and renamed over it. Only a regular file or nothing is replaced."""
    save(LLAMA, tmp_path / "hf")
    out = tmp_path / "node"
    if kind == "character device":
        try:
            os.mknod(out, 0o600 | stat.S_IFCHR, os.makedev(1, 7))
        except PermissionError:
            pytest.skip("mknod needs root")
    elif kind == "FIFO":
        os.mkfifo(out)
    else:
        out.mkdir()
    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", "q8_0", "--out", out, "--force")
    assert r.returncode == 2, r.stderr
    assert (f"mhsa: error: --out: expected a regular file or a path that does not exist (a new file is renamed "
            f"into place), got a {kind} '{out}'") in r.stderr, r.stderr
    assert not stat.S_ISREG(os.lstat(out).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "node"]


def test_quantize_to_a_full_disk_keeps_the_previous_file(tmp_path):
    """A file-size limit stands in for a full disk (writes fail with EFBIG, without root): an output
    error, exit status 1 as for any output that cannot be written, naming the file and the reason;
    the file --force would have replaced is kept and no temporary is left."""
    save(LLAMA, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    assert run_cli("quantize", "--model", tmp_path / "hf", "--to", "q8_0", "--out", out).returncode == 0
    before = out.read_bytes()

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, len(before) // 2))

    r = run_cli("quantize", "--model", tmp_path / "hf", "--to", "f32", "--out", out, "--force", preexec_fn=limit)
    assert r.returncode == 1, r.stderr
    assert f"expected a complete write, got '{out}': File too large" in r.stderr, r.stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "m.gguf"]


def tiny_gpt2_dir(path, seed=0):
    """A GPT-2 directory with a byte-level BPE of GPT-2's alphabet, 3 merges and <|endoftext|>;
    its tokens and merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = [b for b in range(256) if b not in bs]
    alphabet = [chr(b) for b in bs] + [chr(256 + i) for i in range(len(extra))]  # GPT-2's bytes_to_unicode
    tokens = alphabet + ["ab", "abc", "\u0120z", "<|endoftext|>"]
    merges = ["a b", "ab c", "\u0120 z"]
    state = save((GPT2[0], {**GPT2[1], "vocab_size": len(tokens), "bos_token_id": len(tokens) - 1,
                            "eos_token_id": len(tokens) - 1}, GPT2[2]), path, seed)
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    return state, tokens, merges


def test_gpt2_tokenizer_is_written_and_read(tmp_path):
    """A GPT-2 directory's vocab.json + merges.txt become tokenizer.ggml.* (model "gpt2"), which
    `mhsa generate --model FILE.gguf` reads back: the same ids and tokens as from the directory."""
    _, tokens, _ = tiny_gpt2_dir(tmp_path / "hf")
    vocab = {t: i for i, t in enumerate(tokens)}
    out = tmp_path / "m.gguf"
    assert run_cli("quantize", "--model", tmp_path / "hf", "--to", "f32", "--out", out).returncode == 0
    meta = mhsa.read_gguf(out, load=False)["metadata"]
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"] == tokens and meta["tokenizer.ggml.merges"] == ["a b", "ab c", "\u0120 z"]
    runs = [run_cli("generate", "--model", m, "--prompt", "abcd zab", "-n", "5", "--json", "--ignore-eos")
            for m in (tmp_path / "hf", out)]
    assert runs[0].returncode == 0 and runs[1].returncode == 0, runs[1].stderr
    a, b = (json.loads(r.stdout) for r in runs)
    assert a["prompt_ids"] == b["prompt_ids"] == [vocab["abc"], vocab["d"], vocab["\u0120z"], vocab["ab"]]
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]


def chat_answer(model, messages, *args):
    r = subprocess.run([str(MHSA), "chat", "-t", "1", "--model", str(model), "--messages", "-", "--json", *map(str, args)],
                       input=json.dumps(messages), capture_output=True, text=True, timeout=120)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)


def test_the_gguf_chat_template_is_used_by_chat_and_serve(rng, tmp_path):
    """tokenizer.chat_template in a GGUF file's metadata (as llama.cpp's converter writes it) is the
    template `mhsa chat` and `mhsa serve` render with, bos_token and eos_token its <|endoftext|>:
    the answers equal the same model's from its directory with the template given by file."""
    state, tokens, merges = tiny_gpt2_dir(tmp_path / "hf", seed=int(rng.integers(1 << 30)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    word = "".join(rng.choice(list("abcz "), int(rng.integers(3, 7))))
    template = ("{{ bos_token }}{% for m in messages %}" + word + "{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}"
                "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    (tmp_path / "t.jinja").write_text(template)

    def vocab(w, chat=True):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_eos_token_id(len(tokens) - 1)
        if chat:
            w.add_chat_template(template)
    write_llama_cpp_file(tmp_path / "m.gguf", state, cfg, metadata=vocab)
    messages = [{"role": "user", "content": "".join(rng.choice(list("abcdz "), 6))}]
    n = int(rng.integers(4, 10))  # within GPT2's 48 positions
    rc, got = chat_answer(tmp_path / "m.gguf", messages, "-n", n)
    assert rc == 0, got
    rc, want = chat_answer(tmp_path / "hf", messages, "-n", n, "--chat-template", tmp_path / "t.jinja")
    assert rc == 0, want
    assert got == want

    server = subprocess.Popen([str(MHSA), "serve", "-t", "1", "--model", str(tmp_path / "m.gguf"), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"listening on (http://[\d.]+:\d+)", server.stdout.readline()).group(1)
        body = json.dumps({"messages": messages, "max_tokens": n, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = json.load(r)["choices"][0]["message"]["content"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert answer == want["content"]

    # `mhsa quantize` writes tokenizer_config.json's template the same way.
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert run_cli("quantize", "--model", tmp_path / "hf", "--to", "f32", "--out", tmp_path / "q.gguf").returncode == 0
    assert mhsa.read_gguf(tmp_path / "q.gguf", load=False)["metadata"]["tokenizer.chat_template"] == template
    assert chat_answer(tmp_path / "q.gguf", messages, "-n", n) == (0, want)

    write_llama_cpp_file(tmp_path / "bare.gguf", state, cfg, metadata=lambda w: vocab(w, chat=False))
    rc, err = chat_answer(tmp_path / "bare.gguf", messages)
    assert rc == 2 and "tokenizer.chat_template in the GGUF file" in err and "--chat-template FILE" in err


def test_other_gguf_tokenizers_are_refused(tmp_path):
    save(LLAMA, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    assert run_cli("quantize", "--model", tmp_path / "hf", "--to", "f32", "--out", out).returncode == 0
    r = run_cli("generate", "--model", out, "--prompt", "x", "-n", "1")
    assert r.returncode == 2 and "tokenizer.ggml.model" in r.stderr and "no_vocab" in r.stderr


# ---- corrupt files ---------------------------------------------------------------------------

def gguf_bytes(kvs=(), tensors=(), version=3, n_kvs=None, n_tensors=None, alignment=32, data=b""):
    """A GGUF file by hand: kvs [(key, type id, payload bytes)], tensors [(name, dims, type, offset)]."""
    s = lambda t: struct.pack("<Q", len(t)) + t  # noqa: E731
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(kvs) if n_kvs is None else n_kvs)
    for key, t, payload in kvs:
        out += s(key.encode()) + struct.pack("<I", t) + payload
    for name, dims, t, off in tensors:
        out += s(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, off)
    out += b"\0" * (-len(out) % alignment)
    return out + data


GOOD = dict(kvs=[("general.architecture", 8, struct.pack("<Q", 5) + b"llama")],
            tensors=[("a", [4, 2], 0, 0), ("b", [32], 8, 32)], data=bytes(32) + bytes(34))

CORRUPT = {
    "truncated header": (lambda b: b[:20], "bytes left"),
    "not gguf": (lambda b: b"GGML" + b[4:], "magic"),
    "version 1": (lambda b: gguf_bytes(**{**GOOD, "version": 1}), "version"),
    "big-endian": (lambda b: gguf_bytes(**{**GOOD, "version": 3 << 24}), "big-endian"),
    "huge tensor count": (lambda b: gguf_bytes(**{**GOOD, "n_tensors": 1 << 62}), "tensor count"),
    "huge kv count": (lambda b: gguf_bytes(**{**GOOD, "n_kvs": 1 << 60}), "metadata count"),
    "huge string": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("k", 8, struct.pack("<Q", 1 << 63))]}), "bytes left"),
    "huge array": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("k", 9, struct.pack("<IQ", 4, 1 << 61))]}), "length"),
    "nested array": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("k", 9, struct.pack("<IQ", 9, 1))]}), "nested"),
    "bad value type": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("k", 13, b"")]}), "value type"),
    "bad bool": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("k", 7, b"\x07")]}), "bool"),
    "duplicate key": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("k", 0, b"\1"), ("k", 0, b"\2")]}), "each key once"),
    "bad alignment": (lambda b: gguf_bytes(**{**GOOD, "kvs": [("general.alignment", 4, struct.pack("<I", 24))]}),
                      "power of two"),
    "bad type id": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [4, 2], 77, 0)]}), "ggml type id"),
    "five dims": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [1] * 5, 0, 0)]}), "n_dims"),
    "dims overflow": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [1 << 40, 1 << 40], 0, 0)]}), "product"),
    "partial block": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("b", [33], 8, 0)]}), "block"),
    "offset past the end": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [4, 2], 0, 64)]}), "data section"),
    "huge offset": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [4, 2], 0, (1 << 64) - 32)]}), "data section"),
    "unaligned offset": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [4, 2], 0, 4)]}), "alignment"),
    "overlapping": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [8, 2], 0, 0), ("b", [32], 8, 32)]}),
                    "apart from tensor"),
    "duplicate name": (lambda b: gguf_bytes(**{**GOOD, "tensors": [("a", [4], 0, 0), ("a", [4], 0, 32)]}),
                       "each tensor name once"),
}


def test_the_good_file_reads(tmp_path):
    (tmp_path / "g.gguf").write_bytes(gguf_bytes(**GOOD))
    got = mhsa.read_gguf(tmp_path / "g.gguf")
    assert got["shapes"] == {"a": [2, 4], "b": [32]} and got["types"] == {"a": "F32", "b": "Q8_0"}
    assert got["metadata"] == {"general.architecture": "llama"}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_files_give_clear_errors(name, tmp_path):
    make, words = CORRUPT[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(make(gguf_bytes(**GOOD)))
    with pytest.raises(mhsa.Error, match=f"gguf {path}") as e:
        mhsa.read_gguf(path)
    assert words in str(e.value)
    with pytest.raises(mhsa.Error):
        mhsa.Model.load(path)


def test_every_truncation_is_an_error(rng, tmp_path):
    save(LLAMA, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    assert run_cli("quantize", "--model", tmp_path / "hf", "--to", "q8_0", "--out", out).returncode == 0
    data = out.read_bytes()
    end = len(data) - 32  # the last tensor ends in the last 32 bytes (then padding, which may go)
    for cut in sorted(set(rng.integers(0, end, 40).tolist()) | {0, 3, 4, 23, 24, end}):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(mhsa.Error, match="gguf"):
            mhsa.Model.load(tmp_path / "cut.gguf")


def test_model_metadata_is_checked(tmp_path):
    def llama_file(**overrides):
        kv = lambda k, v: (k, 4, struct.pack("<I", v))  # noqa: E731
        kvs = [("general.architecture", 8, struct.pack("<Q", 5) + b"llama"), kv("llama.block_count", 1),
               kv("llama.embedding_length", 8), kv("llama.attention.head_count", 2), kv("llama.context_length", 16),
               kv("llama.feed_forward_length", 4)]
        kvs = [(k, t, overrides.pop(k, p)) for k, t, p in kvs] + [(k, 4, p) for k, p in overrides.items()]
        return gguf_bytes(kvs=kvs, tensors=[("token_embd.weight", [8, 10], 0, 0)], data=bytes(320))
    cases = {
        "llama.block_count": (struct.pack("<I", 1000), "block_count"),
        "llama.attention.head_count": (struct.pack("<I", 3), "head_count"),
        "llama.rope.dimension_count": (struct.pack("<I", 2), "partial rotary"),
        "llama.embedding_length": (struct.pack("<I", 9), "token_embd"),
    }
    for key, (payload, words) in cases.items():
        (tmp_path / "m.gguf").write_bytes(llama_file(**{key: payload}))
        with pytest.raises(mhsa.Error, match=words):
            mhsa.Model.load(tmp_path / "m.gguf")
    (tmp_path / "m.gguf").write_bytes(llama_file())
    with pytest.raises(mhsa.Error, match="blk.0.attn_norm.weight"):  # a missing tensor, named
        mhsa.Model.load(tmp_path / "m.gguf")
