"""mhsa: multi-head self-attention on the CPU.

The names mirror PyTorch's: ``scaled_dot_product_attention``, ``MultiHeadAttention``.
Arrays are float32 NumPy arrays with any strides; errors are raised as ``mhsa.Error``,
a subclass of ``ValueError``; a file that cannot be written (a full disk) as ``mhsa.WriteError``,
a subclass of ``mhsa.Error`` whose ``errno`` is the system's.
"""

from ._core import (
    ChatSession,
    ChatTemplate,
    GPT2,
    GPT2Cache,
    Error,
    KVCache,
    Model,
    MultiHeadAttention,
    Tokenizer,
    WriteError,
    attention_probabilities,
    cached_memory_bytes,
    load_checkpoint,
    load_safetensors,
    model_parameters,
    read_gguf,
    read_gguf_config,
    read_model_config,
    release_cached_memory,
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
    "Model",
    "MultiHeadAttention",
    "Tokenizer",
    "WriteError",
    "attention_probabilities",
    "cached_memory_bytes",
    "load_checkpoint",
    "load_safetensors",
    "model_parameters",
    "read_gguf",
    "read_gguf_config",
    "read_model_config",
    "release_cached_memory",
    "save_gguf",
    "save_safetensors",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "set_cached_memory_limit",
    "sinusoidal_positional_encoding",
]
__version__ = "0.1.0"
