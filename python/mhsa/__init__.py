"""mhsa: multi-head self-attention on the CPU.

The names mirror PyTorch's: ``scaled_dot_product_attention``, ``MultiHeadAttention``.
Arrays are float32 NumPy arrays with any strides (attention also takes float16 and bfloat16);
other dtypes, NumPy's default float64 among them, are refused, never converted silently: the
error names the conversion (``x.astype(numpy.float32)``). Errors are raised as ``mhsa.Error``,
a subclass of ``ValueError``; a file that cannot be written (a full disk) as ``mhsa.WriteError``,
a subclass of ``mhsa.Error`` whose ``errno`` is the system's.
"""

import threading

from ._core import _profile_begin, _profile_end
from ._core import (
    ChatSession,
    ChatTemplate,
    GPT2,
    GPT2Cache,
    Error,
    KVCache,
    Lora,
    Model,
    MultiHeadAttention,
    Tokenizer,
    WriteError,
    attention_probabilities,
    bf16_dot_product,
    cached_memory_bytes,
    load_checkpoint,
    load_safetensors,
    model_parameters,
    named_models,
    read_gguf,
    read_gguf_config,
    read_model_config,
    release_cached_memory,
    resolve_model,
    save_gguf,
    save_safetensors,
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    set_cached_memory_limit,
    sinusoidal_positional_encoding,
)

__all__ = [
    "ChatSession",
    "ChatTemplate",
    "Error",
    "GPT2",
    "GPT2Cache",
    "KVCache",
    "Lora",
    "Model",
    "MultiHeadAttention",
    "PHASES",
    "Tokenizer",
    "WriteError",
    "attention_probabilities",
    "bf16_dot_product",
    "cached_memory_bytes",
    "load_checkpoint",
    "load_safetensors",
    "model_parameters",
    "named_models",
    "profile",
    "read_gguf",
    "read_gguf_config",
    "read_model_config",
    "release_cached_memory",
    "resolve_model",
    "save_gguf",
    "save_safetensors",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "set_cached_memory_limit",
    "sinusoidal_positional_encoding",
]
__version__ = "0.1.0"

_profiling = threading.local()  # .open: a profile is open on this thread

PHASES = ("embed", "norm", "qkv", "attention", "out_proj", "mlp_in", "activation", "mlp_out", "residual", "head")


class profile:
    """Where the forwards run in a ``with`` block spend their time, phase by phase (as ``mhsa bench
    --profile``): the embedding, the layers' norms, the q|k|v projection (with RoPE and q/k norms),
    the attention (the cache written and read), the output projection, the MLP's input projections,
    its activation and its output projection, the residual adds, and the head (final norm and LM
    head). Only forwards run by this thread in the block count (``Model.forward``, ``generate``,
    cache steps, ``ChatSession``); the kernels' own threads work inside a phase, so a phase's time
    is wall time. Off, a phase costs one atomic load. One profile at a time per thread (nesting
    raises ``mhsa.Error``); other threads may profile their own forwards meanwhile.

    After the block: ``seconds`` and ``calls`` (dicts by phase name, in ``PHASES`` order),
    ``forwards`` (the head's calls: one per forward), ``layers`` (per-layer calls per forward), and
    ``str(p)`` a table like the CLI's::

        with mhsa.profile() as p:
            model.generate(ids, max_new_tokens=32)
        print(p)
    """

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self.forwards = self.layers = 0

    def __enter__(self):
        if getattr(_profiling, "open", False):
            raise Error("mhsa.profile: expected no other profile open on this thread, got one")
        _profile_begin()
        _profiling.open = True
        return self

    def __exit__(self, *exc):
        seconds, calls = _profile_end()
        _profiling.open = False
        self.seconds = {k: seconds[k] for k in PHASES}
        self.calls = {k: calls[k] for k in PHASES}
        self.forwards = self.calls["head"]
        self.layers = self.calls["qkv"] // self.forwards if self.forwards else 0
        return False

    def __str__(self):
        if not self.forwards:
            return "mhsa.profile: no forward ran"
        total = sum(self.seconds.values())
        lines = [f"{self.forwards} forwards of {self.layers} layers, {1e3 * total / self.forwards:.3f} ms each "
                 "in these phases:", f"  {'phase':<12}{'ms':>10}{'us/layer':>11}{'share':>8}"]
        for k in PHASES:
            ms = 1e3 * self.seconds[k] / self.forwards
            per_layer = f"{1e3 * ms / self.layers:11.1f}" if self.layers and k not in ("embed", "head") else " " * 11
            lines.append(f"  {k:<12}{ms:10.3f}{per_layer}{100 * self.seconds[k] / total:7.1f}%")
        return "\n".join(lines)
