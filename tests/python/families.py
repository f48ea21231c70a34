"""The model families of test_families.py: tiny random configs of each, real models' shapes with few
layers, and what transformers itself makes of a config (read off the model it builds, not off the
config's keys), in the terms of mhsa's ModelConfig.

Not a test module: test_families.py uses it.
"""

import math

import torch
import transformers
from transformers.initialization import no_init_weights

# Each case: the config class, its arguments, and the causal-LM class. Sizes are odd where the
# family allows it; every case has grouped heads. eos_token_id None: generation never stops early.
TINY = {
    # Llama 3.x's rope_scaling with a short original context, so that the scaled frequencies
    # matter at test lengths; head_dim ≠ hidden / heads; tied head.
    "llama_llama3": (transformers.LlamaConfig, dict(
        vocab_size=101, hidden_size=48, intermediate_size=83, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=14, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16)), transformers.LlamaForCausalLM),
    # Untied head, biases on attention and MLP, linear RoPE scaling.
    "llama_untied_bias": (transformers.LlamaConfig, dict(
        vocab_size=89, hidden_size=36, intermediate_size=61, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=3, max_position_embeddings=64, tie_word_embeddings=False, attention_bias=True,
        mlp_bias=True, rope_scaling=dict(rope_type="linear", factor=2.5)), transformers.LlamaForCausalLM),
    # A window shorter than the test sequences.
    "mistral_window": (transformers.MistralConfig, dict(
        vocab_size=97, hidden_size=40, intermediate_size=71, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=64, sliding_window=5), transformers.MistralForCausalLM),
    # q/k/v biases; sliding windows from layer 1 on.
    "qwen2_bias": (transformers.Qwen2Config, dict(
        vocab_size=103, hidden_size=56, intermediate_size=45, num_hidden_layers=3, num_attention_heads=7,
        num_key_value_heads=1, max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=True, sliding_window=6, max_window_layers=1), transformers.Qwen2ForCausalLM),
    # q/k RMSNorm; head_dim · heads ≠ hidden; biases everywhere in attention.
    "qwen3_qk_norm": (transformers.Qwen3Config, dict(
        vocab_size=91, hidden_size=40, intermediate_size=67, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=10, max_position_embeddings=64, attention_bias=True),
        transformers.Qwen3ForCausalLM),
    # Soft-caps that bite, alternating windows (the first layer slides), its own score scale.
    "gemma2_softcap": (transformers.Gemma2Config, dict(
        vocab_size=95, hidden_size=32, intermediate_size=57, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=64, query_pre_attn_scalar=20,
        attn_logit_softcapping=3.0, final_logit_softcapping=4.0, sliding_window=5), transformers.Gemma2ForCausalLM),
    # Norms only after attention and the MLP; q/k norms over all heads at once; head_dim · heads ≠
    # hidden; biases in attention.
    "olmo2_post_norms": (transformers.Olmo2Config, dict(
        vocab_size=93, hidden_size=48, intermediate_size=71, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=10, max_position_embeddings=64, attention_bias=True, pad_token_id=3),
        transformers.Olmo2ForCausalLM),
    # Fused qkv_proj and gate_up_proj in the file; a window shorter than the test sequences.
    "phi3_fused": (transformers.Phi3Config, dict(
        vocab_size=89, hidden_size=40, intermediate_size=61, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=6, pad_token_id=0),
        transformers.Phi3ForCausalLM),
}

# Real models' shapes with random weights and few layers (the vocabulary, widths and heads as
# published). "sharded": written in several files through model.safetensors.index.json.
REAL = {
    "smollm2_135m": (transformers.LlamaConfig, dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True), transformers.LlamaForCausalLM, None),
    "qwen25_05b": (transformers.Qwen2Config, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=1, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768, max_window_layers=24),
        transformers.Qwen2ForCausalLM, "200MB"),
    # Llama-3.2-1B's heads and RoPE (theta, llama3 scaling) on a narrower body and vocabulary.
    "llama32_1b_rope": (transformers.LlamaConfig, dict(
        vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)), transformers.LlamaForCausalLM, None),
}


def logits(model, ids):
    """A transformers model's logits for ids [B, T] as a float64 NumPy array."""
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.double().numpy()


def build(config_class, kwargs, model_class, seed):
    """A float32 model with eager attention and random weights: uniform, with a standard deviation
    of 1.5/sqrt(fan-in), large enough that attention is far from uniform and the soft-caps bite
    (transformers' own 0.02 leaves every score near 0); norms and biases off their neutral values,
    so that a misplaced one shows. Filled without transformers' initialisation (seconds saved on a
    real vocabulary)."""
    cfg = config_class(**{"eos_token_id": None, **kwargs})
    cfg._attn_implementation = "eager"
    with no_init_weights():
        model = model_class(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=gen) - 0.5))
            elif name.endswith(".bias"):
                p.copy_(0.4 * (torch.rand(p.shape, generator=gen) - 0.5))
            else:
                half_width = 1.5 * math.sqrt(3 / p.shape[-1])
                p.uniform_(-half_width, half_width, generator=gen)
    model.tie_weights()
    return model.float().eval()


def window_lefts(model):
    """Each layer's window as transformers applies it: keys before the query's own a query sees
    (sliding_window W: W − 1), −1 for none."""
    cfg, layers = model.config, model.model.layers
    if cfg.model_type in ("mistral", "phi3"):  # the model masks every layer with config.sliding_window
        windows = [cfg.sliding_window] * len(layers)
    else:
        windows = [getattr(layer.self_attn, "sliding_window", None) for layer in layers]
    return [-1 if w is None else w - 1 for w in windows]


def transformers_view(model):
    """What transformers built from a config, as mhsa's ModelConfig fields (read_model_config)."""
    cfg = model.config
    if cfg.model_type == "gpt2":
        raise ValueError("GPT-2 is compared in test_gpt2.py")
    base, layer = model.model, model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    # Phi-3 fuses q|k|v and gate|up; o_proj and down_proj show the widths every family has.
    q_width = attn.o_proj.in_features
    kv_width = attn.k_proj.out_features if hasattr(attn, "k_proj") else (attn.qkv_proj.out_features - q_width) // 2
    q_proj = attn.q_proj if hasattr(attn, "q_proj") else attn.qkv_proj
    embed = base.embed_tokens
    rope = cfg.rope_parameters
    kind = rope.get("rope_type", "default")
    act = type(getattr(mlp, "act_fn", None) or mlp.activation_fn).__name__
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    in_vocab = lambda i: i is not None and 0 <= i < embed.num_embeddings  # noqa: E731
    eos_ids = []
    for i in eos:
        if in_vocab(i) and i not in eos_ids:
            eos_ids.append(i)
    gemma = cfg.model_type == "gemma2"
    view = dict(
        family=cfg.model_type,
        vocab_size=embed.num_embeddings,
        hidden_size=embed.embedding_dim,
        num_layers=len(base.layers),
        num_heads=q_width // attn.head_dim,
        num_kv_heads=kv_width // attn.head_dim,
        head_dim=attn.head_dim,
        intermediate_size=mlp.down_proj.in_features,
        max_positions=cfg.max_position_embeddings,
        norm="rms_norm",
        norm_eps=getattr(base.norm, "variance_epsilon", getattr(base.norm, "eps", None)),
        norm_weight_offset=1.0 if gemma else 0.0,
        positions="rotary",
        rope_theta=float(rope["rope_theta"]),
        rotary_dim=2 * base.rotary_emb.inv_freq.shape[0],
        rope_kind="none" if kind == "default" else kind,
        mlp={"SiLUActivation": "swiglu", "SiLU": "swiglu", "GELUTanh": "geglu",
             "PytorchGELUTanh": "geglu"}.get(act, act),
        qkv_bias=q_proj.bias is not None,
        o_bias=attn.o_proj.bias is not None,
        mlp_bias=mlp.down_proj.bias is not None,
        qk_norm=hasattr(attn, "q_norm"),
        qk_norm_full_width=hasattr(attn, "q_norm") and attn.q_norm.weight.shape[0] != attn.head_dim,
        pre_norms=hasattr(layer, "input_layernorm"),
        post_norms=hasattr(layer, "post_feedforward_layernorm"),
        embedding_scale=float(torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32)) if gemma else 1.0,
        attention_scale=float(attn.scaling) if gemma else 0.0,
        attn_logit_softcap=float(getattr(cfg, "attn_logit_softcapping", None) or 0.0),
        final_logit_softcap=float(getattr(cfg, "final_logit_softcapping", None) or 0.0),
        window_left=window_lefts(model),
        tie_word_embeddings=model.lm_head.weight is embed.weight,
        bos_token_id=cfg.bos_token_id if in_vocab(cfg.bos_token_id) else -1,
        eos_token_ids=eos_ids,
        pad_token_id=-1 if embed.padding_idx is None else embed.padding_idx,  # torch's, negatives resolved
    )
    if not gemma:  # every other family scores with 1/sqrt(head_dim): mhsa's 0
        assert math.isclose(attn.scaling, attn.head_dim ** -0.5)
    if kind != "default":
        view["rope_factor"] = float(rope["factor"])
    if kind == "llama3":
        view["rope_low_freq_factor"] = float(rope["low_freq_factor"])
        view["rope_high_freq_factor"] = float(rope["high_freq_factor"])
        view["rope_original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
    return view


def mhsa_view(config):
    """mhsa.read_model_config's dict in transformers_view's terms."""
    view = {k: v for k, v in config.items() if k not in ("architecture", "rope_scaling")}
    rope = config["rope_scaling"]
    view["rope_kind"] = rope["kind"]
    if rope["kind"] != "none":
        view["rope_factor"] = rope["factor"]
    if rope["kind"] == "llama3":
        view["rope_low_freq_factor"] = rope["low_freq_factor"]
        view["rope_high_freq_factor"] = rope["high_freq_factor"]
        view["rope_original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    return view
