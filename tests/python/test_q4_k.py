"""4-bit weights on the shipped default model (mhsa.Model.load(dir, dtype="q4_k")): bits per byte
on its held-out text rise at most 5% (issue 14's bound for the 4-bit scheme) through the decode
streams (A quantised per 32-value block as for Q8_0, integer dot products per 32-weight
sub-block; +0.45% measured, the same as through the GEMMs, which keep A in float32). The kernels'
own checks are tests/cpp/test_q4_k.cpp's; the file format's are test_gguf.py's."""

import mhsa
import test_default_model as d
from test_default_model import held_out  # noqa: F401  (the fixture)
from test_q8_0 import decoded_bits_per_byte


def test_default_model_decoded_bits_per_byte_rise_at_most_five_percent(held_out):
    """8 windows of 256 bytes decoded one token at a time (test_q8_0.py's measure)."""
    f32, q4 = (decoded_bits_per_byte(mhsa.Model.load(d.MODEL, dtype=t), held_out, 256, 8) for t in ("f32", "q4_k"))
    print(f"default model, decoded: {f32:.5f} bits per byte in f32, {q4:.5f} in q4_k ({100 * (q4 / f32 - 1):+.3f}%)")
    assert q4 <= 1.05 * f32
