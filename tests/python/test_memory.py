"""Tensor memory from Python: mhsa keeps freed blocks (256 KiB and up) for reuse, and
release_cached_memory / set_cached_memory_limit / cached_memory_bytes control and report it."""

import numpy as np

import mhsa


def test_cached_memory_is_reported_released_and_limited():
    rng = np.random.default_rng()
    m = mhsa.MultiHeadAttention(256, 4)
    x = rng.standard_normal((1, 512, 256), dtype=np.float32)  # 512 KiB activations inside the layer
    try:
        mhsa.set_cached_memory_limit(256 << 20)
        mhsa.release_cached_memory()
        assert mhsa.cached_memory_bytes() == 0
        first = m(x, is_causal=True)
        assert mhsa.cached_memory_bytes() >= 512 << 10  # the layer's temporaries, kept
        np.testing.assert_array_equal(m(x, is_causal=True), first)  # reused blocks change nothing
        mhsa.release_cached_memory()
        assert mhsa.cached_memory_bytes() == 0
        mhsa.set_cached_memory_limit(0)
        m(x, is_causal=True)
        assert mhsa.cached_memory_bytes() == 0
    finally:
        mhsa.set_cached_memory_limit(1 << 30)  # the tests after this one: room enough
