"""8-bit weights: mhsa.Model.load(dir, dtype="q8_0") on tiny random GPT-2 and grouped-query Llama
directories (written float32 by transformers' save_pretrained) against transformers.

- Prefill (over 64 rows: every matrix, the LM head included, takes the GEMM, whose A stays float32):
  its logits are those of the float64 model on the weights quantised to Q8_0 and dequantised by
  this file's own NumPy transcription of ggml's reference quantiser (within 1e-4 relative L2, the
  float32 test's bound): only the weights are quantised, every sum is float32. A matrix whose rows
  are not whole 32-weight blocks stays float32 (the Llama's down_proj, 72 inputs).
- Decoding through the cache (the streams, which quantise their activations per 32-value block as
  well) gives the forward's logits within what that costs; the dtype is reported; gradients are
  refused; the shipped default model loses at most 1% in bits per byte, through the GEMMs and
  through the decode streams; the CLI takes --dtype q8_0.
"""

import copy

import numpy as np
import pytest
import torch

import mhsa

transformers = pytest.importorskip("transformers")
import families  # noqa: E402  (tests/python, beside this file)
from conftest import rel_l2 as rel  # noqa: E402
from families import logits  # noqa: E402
import test_default_model as d  # noqa: E402
from test_default_model import held_out  # noqa: E402,F401  (the fixture)

CASES = {
    "gpt2": (transformers.GPT2Config, dict(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64),
             transformers.GPT2LMHeadModel),
    "llama": (transformers.LlamaConfig, dict(
        vocab_size=89, hidden_size=64, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, attention_bias=True),
        transformers.LlamaForCausalLM),
}


def q8_0_round_trip(w):
    """w [rows, K] (K a multiple of 32) through ggml's quantize_row_q8_0 and back, float32."""
    x = np.asarray(w, np.float32).reshape(w.shape[0], -1, 32)
    amax = np.abs(x).max(axis=2, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (x * inv).astype(np.float32).astype(np.float64)
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)  # roundf: half away from zero
    return (d.astype(np.float16).astype(np.float32) * q.astype(np.float32)).reshape(w.shape)


@pytest.mark.parametrize("case", list(CASES))
def test_q8_0_weights_against_transformers_on_dequantised_weights(case, rng, tmp_path):
    config_class, kwargs, model_class = CASES[case]
    hf = families.build(config_class, kwargs, model_class, int(rng.integers(2**31)))
    hf.save_pretrained(tmp_path)
    m = mhsa.Model.load(tmp_path, dtype="q8_0")
    assert m.dtype == "q8_0"
    ids = rng.integers(0, hf.config.vocab_size, size=(5, int(rng.integers(14, 20))))  # > 64 rows
    got = m.forward(ids)

    # The float64 model on the dequantised weights: GPT-2's Conv1D weights [in, out] are quantised
    # along `in` (as mhsa stores them, [out, in]); learned positions stay float32.
    conv1d = case == "gpt2"
    quantised = copy.deepcopy(hf).double()
    count = 0
    with torch.no_grad():
        for name, p in quantised.named_parameters():
            if p.dim() != 2 or "wpe" in name:
                continue
            w = p.float().numpy()
            transposed = conv1d and "wte" not in name
            w = w.T if transposed else w
            if w.shape[1] % 32:
                assert "down_proj" in name, name  # the one matrix this test expects to stay float32
                continue
            w = q8_0_round_trip(w)
            p.copy_(torch.from_numpy(np.ascontiguousarray(w.T if transposed else w)).double())
            count += 1
    assert count > 4
    assert rel(got, logits(quantised, ids)) <= 1e-4
    assert rel(got, logits(copy.deepcopy(hf).double(), ids)) > 1e-4  # the weights really were quantised

    # Decoding 2 sequences (2 rows: every matrix streamed, its input quantised per block; up to
    # 2.1e-2 relative L2 seen on these models, whose random weights are large).
    cache = m.new_cache(2, ids.shape[1])
    parts = [m.extend(cache, ids[:2, :3])] + [m.extend(cache, ids[:2, t:t + 1]) for t in range(3, ids.shape[1])]
    assert rel(np.concatenate(parts, axis=1), got[:2]) <= 6e-2
    with pytest.raises(Exception, match="float32 weights"):
        m.loss_and_grad(ids, ids)


def test_default_model_bits_per_byte_rise_at_most_one_percent(held_out):
    """The shipped default model on its held-out text (test_default_model.py's split), its first 48
    windows of 512 bytes as the bf16 test: Q8_0 weights cost at most 1% in bits per byte."""
    text = held_out[:48 * 512 + 1]
    f32, q8 = (d.bits_per_byte(mhsa.Model.load(d.MODEL, dtype=t), text, 512) for t in ("f32", "q8_0"))
    print(f"default model: {f32:.5f} bits per byte in f32, {q8:.5f} in q8_0 ({100 * (q8 / f32 - 1):+.3f}%)")
    assert q8 <= 1.01 * f32


def decoded_bits_per_byte(model, tokens, T, windows):
    """Bits per byte of `windows` windows of T tokens decoded one token at a time, 8 sequences at a
    time: every matrix is streamed (the LM head too), as when generating."""
    total = 0.0
    for w0 in range(0, windows, 8):
        ids = np.stack([tokens[s * T:s * T + T + 1] for s in range(w0, min(windows, w0 + 8))])
        cache = model.new_cache(len(ids), T)
        for t in range(T):
            z = model.extend(cache, ids[:, t:t + 1])[:, 0].astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            total -= log_p[np.arange(len(ids)), ids[:, t + 1]].sum()
    return total / (windows * T) / np.log(2)


def test_default_model_decoded_bits_per_byte_rise_at_most_one_percent(held_out):
    """The same through the decode streams (activations quantised too), on 8 windows of 256 bytes."""
    f32, q8 = (decoded_bits_per_byte(mhsa.Model.load(d.MODEL, dtype=t), held_out, 256, 8) for t in ("f32", "q8_0"))
    print(f"default model, decoded: {f32:.5f} bits per byte in f32, {q8:.5f} in q8_0 ({100 * (q8 / f32 - 1):+.3f}%)")
    assert q8 <= 1.01 * f32


def test_cli_dtype_q8_0():
    """--dtype q8_0 generates the float32 model's greedy text (the default model, 24 tokens: its
    logits move by far less than the gaps greedy decoding meets there), and the bench names its cases."""
    import subprocess

    def run(*args):
        r = subprocess.run([str(d.CLI), *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    prompt = ["generate", "--prompt", "In the beginning", "-n", "24"]
    assert run(*prompt, "--dtype", "q8_0") == run(*prompt)
    bench = run("bench", "--model", str(d.MODEL), "--dtype", "q8_0", "--filter", "tg", "--min-seconds", "0.01")
    assert "gpt2_q8_0_tg" in bench
