"""Rejected inputs: every case raises mhsa.Error (a ValueError) whose message names the argument,
says what was expected and shows what was given ("<function>: <argument>: expected <X>, got <Y>"),
and a failed step() leaves the cache as it was.
"""

from contextlib import contextmanager

import numpy as np
import pytest

import mhsa

SDPA = mhsa.scaled_dot_product_attention


@contextmanager
def rejects(pattern):
    """Expects mhsa.Error with a message matching `pattern` (re.search)."""
    with pytest.raises(ValueError, match=pattern) as info:
        yield
    assert info.type is mhsa.Error, f"raised {info.type.__name__}, not mhsa.Error"


@pytest.fixture
def qkv(rng):
    """q [2, 4, 5, 8], k and v [2, 2, 7, 8]."""
    return tuple(rng.standard_normal(shape, dtype=np.float32) for shape in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)))


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def test_error_is_a_value_error():
    assert issubclass(mhsa.Error, ValueError)


def test_float64_input(qkv):
    q, k, v = qkv
    with rejects(r"^scaled_dot_product_attention: q: expected .*float32.*, got .*float64"):
        SDPA(q.astype(np.float64), k, v)


def test_wrong_dimensionality(qkv):
    q, k, v = qkv
    with rejects(r"q: expected a 4-D .*, got 3-D"):
        SDPA(q[0], k, v)


def test_batch_mismatch(rng, qkv):
    _, k, v = qkv
    with rejects(r"k\.shape\[0\]: expected 3 .*, got 2"):
        SDPA(randn(rng, 3, 4, 5, 8), k, v)


def test_query_heads_not_a_multiple_of_kv_heads(rng, qkv):
    _, k, v = qkv
    with rejects(r"k\.shape\[1\]: expected .*dividing .*= 3.*, got 2"):
        SDPA(randn(rng, 2, 3, 5, 8), k, v)


def test_head_size_mismatch(rng, qkv):
    _, k, v = qkv
    with rejects(r"k\.shape\[3\]: expected 9 .*, got 8"):
        SDPA(randn(rng, 2, 4, 5, 9), k, v)


def test_value_length_mismatch(rng, qkv):
    q, k, _ = qkv
    with rejects(r"v\.shape\[2\]: expected 7 .*, got 6"):
        SDPA(q, k, randn(rng, 2, 2, 6, 8))


@pytest.mark.parametrize("scale,shown", [(float("nan"), "nan"), (float("inf"), "inf"), (0.0, "0"), (-1.5, "-1.5")])
def test_bad_scale(qkv, scale, shown):
    with rejects(rf"scale: expected .*, got {shown}$"):
        SDPA(*qkv, scale=scale)


def test_negative_kv_length(qkv):
    with rejects(r"kv_lengths\[1\]: expected .*, got -1$"):
        SDPA(*qkv, kv_lengths=[7, -1])


def test_kv_length_beyond_keys(qkv):
    with rejects(r"kv_lengths\[0\]: expected .*Tk = 7.*, got 8$"):
        SDPA(*qkv, kv_lengths=[8, 2])


def test_kv_lengths_wrong_count(qkv):
    with rejects(r"kv_lengths: expected 2 entries.*, got 1 entries"):
        SDPA(*qkv, kv_lengths=[1])


def test_kv_lengths_float_dtype(qkv):
    with rejects(r"kv_lengths: expected .*integers.*, got dtype float64"):
        SDPA(*qkv, kv_lengths=np.array([1.0, 2.0]))


@pytest.mark.parametrize("shape", [(5, 6), (3, 5, 7), (2, 2, 5, 7)], ids=str)
def test_mask_not_broadcastable(rng, qkv, shape):
    """For q [2, 4, 5, 8] and k [2, 2, 7, 8]: neither Hq nor Tk may be wrong."""
    shown = r"\[" + ", ".join(map(str, shape)) + r"\]"
    with rejects(rf"attn_mask: expected .*broadcastable.*, got {shown}"):
        SDPA(*qkv, attn_mask=randn(rng, *shape))


def test_mask_with_nan(rng, qkv):
    mask = randn(rng, 5, 7)
    mask[1, 2] = np.nan
    with rejects(r"attn_mask: expected .*, got nan"):
        SDPA(*qkv, attn_mask=mask)


def test_none_where_an_array_is_needed(qkv):
    _, k, v = qkv
    with rejects(r"q: expected .*array.*, got None$"):
        SDPA(None, k, v)


def test_string_where_an_array_is_needed(qkv):
    _, k, v = qkv
    with rejects(r"q: expected .*array.*, got .*str"):
        SDPA("not an array", k, v)


def test_string_mask(qkv):
    with rejects(r"attn_mask: expected .*array.*, got .*str"):
        SDPA(*qkv, attn_mask="causal")


def test_heads_not_dividing_embed_dim():
    with rejects(r"num_heads: expected .*dividing embed_dim = 10.*, got 3$"):
        mhsa.MultiHeadAttention(embed_dim=10, num_heads=3)


def test_kv_heads_not_dividing_heads():
    with rejects(r"num_kv_heads: expected .*dividing num_heads = 4.*, got 3$"):
        mhsa.MultiHeadAttention(12, 4, num_kv_heads=3)


def test_set_weights_wrong_shape(rng):
    m = mhsa.MultiHeadAttention(12, 4)
    before = m.w_qkv.copy()
    with rejects(r"w_qkv: expected \[12, 36\], got \[12, 35\]"):
        m.w_qkv = randn(rng, 12, 35)
    with rejects(r"w_qkv: expected .*2-D.*, got 1-D"):
        m.w_qkv = randn(rng, 36)
    with rejects(r"w_qkv: expected .*, got None$"):
        m.w_qkv = None
    assert np.array_equal(m.w_qkv, before)


def test_input_with_wrong_channels(rng):
    with rejects(r"x\.shape\[2\]: expected 12 .*, got 11$"):
        mhsa.MultiHeadAttention(12, 4)(randn(rng, 2, 3, 11))


def test_layer_input_none():
    with rejects(r"x: expected .*array.*, got None$"):
        mhsa.MultiHeadAttention(12, 4)(None)


def test_cache_overflow_leaves_cache_unchanged(rng):
    m = mhsa.MultiHeadAttention(12, 4)
    cache = m.new_cache(2, 4)
    m.step(randn(rng, 2, 3, 12), cache)
    keys, values = cache.keys.copy(), cache.values.copy()
    with rejects(r"x\.shape\[1\]: expected at most 1 new tokens.*, got 2 new tokens"):
        m.step(randn(rng, 2, 2, 12), cache)
    assert cache.length == 3
    assert np.array_equal(cache.keys, keys) and np.array_equal(cache.values, values)


def test_cache_from_another_layer_shape(rng):
    m = mhsa.MultiHeadAttention(12, 4)
    cache = mhsa.MultiHeadAttention(12, 3).new_cache(2, 4)
    with rejects(r"cache: expected 4 kv heads of size 3.*, got 3 kv heads of size 4"):
        m.step(randn(rng, 2, 1, 12), cache)
    assert cache.length == 0


def test_cache_batch_mismatch(rng):
    m = mhsa.MultiHeadAttention(12, 4)
    cache = m.new_cache(2, 4)
    with rejects(r"cache: expected batch 3.*, got batch 2$"):
        m.step(randn(rng, 3, 1, 12), cache)
    assert cache.length == 0


def test_projected_memory_from_another_layer_shape(rng):
    memory = mhsa.MultiHeadAttention(12, 3).project_memory(randn(rng, 2, 5, 12))
    with rejects(r"memory: expected 4 kv heads of size 3.*, got 3 kv heads of size 4"):
        mhsa.MultiHeadAttention(12, 4)(randn(rng, 2, 3, 12), memory=memory)


# ---- sizes: every product of sizes is checked; allocation failure is an error, not a crash ----


def test_cache_too_large_to_address():
    # Was a cache reporting capacity 2^60 over a 0-byte buffer; the next step() wrote past it.
    with rejects(r"^KVCache: keys \[B, Hkv, capacity, D\]: expected a size that fits in memory .*, got \[1, 4, 1152921504606846976, 3\] = "):
        mhsa.MultiHeadAttention(12, 4).new_cache(1, 1 << 60)


def test_cache_larger_than_memory():
    # Addressable (48 PiB) but more than any machine has: an error with the bytes, not a MemoryError abort.
    with rejects(r"^KVCache: keys .*: expected 54043195528445952 bytes \(48 PiB\) of free memory .*, got out of memory$"):
        mhsa.MultiHeadAttention(12, 4).new_cache(1 << 20, 1 << 30)


def test_cache_sizes_negative_or_beyond_int64():
    m = mhsa.MultiHeadAttention(12, 4)
    with rejects(r"KVCache: capacity: expected a count >= 0, got -1$"):
        m.new_cache(1, -1)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        m.new_cache(1, 1 << 64)


def test_gpt2_vocabulary_beyond_int32_ids():
    # Was a segfault: wte [2^62, 32] wrapped to an empty tensor.
    with rejects(r"^Gpt2::random: config\.vocab_size: expected at most 2147483647 \(token ids are int32\), got 4611686018427387904$"):
        mhsa.GPT2.random(1 << 62, 16, 32, 1, 2)


def test_gpt2_weights_beyond_memory():
    with rejects(r"^Gpt2::random: config: expected weights that fit in memory \(at most .*\), got .* of weights for vocab_size 50"):
        mhsa.GPT2.random(vocab_size=50, n_positions=16, n_embd=16, n_layer=1 << 50, n_head=2)
    with rejects(r"^Gpt2::random: config: expected weights that fit in memory"):
        mhsa.GPT2.random(vocab_size=50, n_positions=16, n_embd=1 << 62, n_layer=1, n_head=2)


def test_layer_and_encoding_too_large():
    with rejects(r"^MultiHeadAttention: w_o \[C, C\]: expected a size that fits in memory"):
        mhsa.MultiHeadAttention(1 << 62, 1)
    with rejects(r"^sinusoidal_positional_encoding: pe \[tokens, channels\]: expected a size that fits in memory"):
        mhsa.sinusoidal_positional_encoding(1 << 40, 1 << 40)


def test_output_array_too_large_to_address():
    q = np.broadcast_to(np.zeros((1, 1, 1, 1), np.float32), (1, 1, 1 << 31, 1))
    k = np.broadcast_to(np.zeros((1, 1, 1, 1), np.float32), (1, 1, 1 << 33, 1))
    with rejects(r"^attention_probabilities: probs \[B, Hq, Tq, Tk\]: expected a size that fits in memory .*, got \[1, 1, 2147483648, 8589934592\] = 7.38e\+19 bytes$"):
        mhsa.attention_probabilities(q, k)
