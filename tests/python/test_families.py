"""Every family mhsa runs against transformers loading the same directory (written by its own
save_pretrained, float32, eager attention).

- Configs: mhsa.read_model_config equals what transformers builds from the same config.json (read
  off the model: projection sizes, biases, norms, windows, scales), for tiny configs of each family
  and for real hub configs (tests/fuzz/config_corpus); each layer's window is also checked against
  the attention probabilities transformers computes.
- Models (mhsa.Model): logits within 1e-4 relative L2, decoding through the cache equal to
  recomputing, greedy generation giving transformers' tokens — for tiny configs of each family
  (Llama with llama3 RoPE scaling / untied head with biases, Mistral with a window shorter than the
  sequence, Qwen2 with q/k/v biases and windows, Qwen3 with q/k norms, Gemma 2 with soft-caps and
  alternating windows, OLMo-2 with post norms only and full-width q/k norms, Phi-3 with fused
  qkv_proj/gate_up_proj and a window) and for real models' shapes with random weights and few
  layers (SmolLM2-135M, Qwen2.5-0.5B written in shards, Llama-3.2-1B's RoPE).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa

transformers = pytest.importorskip("transformers")
import families  # noqa: E402  (tests/python, beside this file)

needs_model = pytest.mark.skipif(not hasattr(mhsa, "Model"),
                                 reason="mhsa.Model (the generic decoder of every family) is not in this build yet")

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "config_corpus"
HUB_CONFIGS = ["smollm2_135m", "llama32_1b", "tinyllama", "mistral_small", "qwen25_05b", "qwen3_06b", "gemma2_2b",
               "olmo2_1b", "phi3_mini"]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_same_config(got, want):
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-7), key
        else:
            assert got[key] == value, key


def meta_model(config):
    """The model transformers builds from a config, without memory for its weights."""
    config._attn_implementation = "eager"
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


# ---- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(families.TINY) + list(families.REAL))
def test_config_matches_transformers(case, tmp_path):
    config_class, kwargs, model_class = (families.TINY.get(case) or families.REAL[case])[:3]
    config = config_class(**kwargs)
    config.save_pretrained(tmp_path)
    want = families.transformers_view(meta_model(config))
    got = families.mhsa_view(mhsa.read_model_config(tmp_path))
    assert_same_config(got, want)


@pytest.mark.parametrize("name", HUB_CONFIGS)
def test_hub_config_matches_transformers(name, tmp_path):
    shutil.copy(CORPUS / f"{name}.json", tmp_path / "config.json")
    want = families.transformers_view(meta_model(transformers.AutoConfig.from_pretrained(tmp_path)))
    got = mhsa.read_model_config(tmp_path / "config.json")
    assert got["architecture"] == json.loads((CORPUS / f"{name}.json").read_text())["architectures"][0]
    assert_same_config(families.mhsa_view(got), want)


@pytest.mark.parametrize("case", list(families.TINY))
def test_windows_are_the_attention_transformers_computes(case, rng, tmp_path):
    """Which keys each layer's queries see in transformers' own probabilities, against window_left."""
    config_class, kwargs, model_class = families.TINY[case]
    model = families.build(config_class, kwargs, model_class, int(rng.integers(2**31)))
    model.config.save_pretrained(tmp_path)
    windows = mhsa.read_model_config(tmp_path)["window_left"]
    T = 13
    with torch.no_grad():
        probs = model(torch.tensor(rng.integers(0, kwargs["vocab_size"], size=(1, T))), output_attentions=True).attentions
    i, j = np.indices((T, T))
    for layer, w in enumerate(windows):
        visible = (j <= i) & ((j >= i - w) if w >= 0 else True)
        seen = probs[layer][0].numpy() > 0
        assert (seen == visible[None]).all(), f"layer {layer}: window_left {w}"


@pytest.mark.parametrize("config, key", [
    ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 2048}}, "rope_scaling: rope_type"),
    ({"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling: type"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "llama", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"model_type": "falcon"}, "model_type"),
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4,
                                             "long_factor": [1.0] * 4}}, "rope_scaling: type"),
    ({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]}, r"architectures\[0\]"),
    ({"model_type": "gemma2", "use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"model_type": "qwen2", "layer_types": ["sliding_attention"], "num_hidden_layers": 1}, "sliding_window"),
])
def test_refuses_configs_it_cannot_run(config, key, tmp_path):
    small = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8,
             "vocab_size": 32, "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps({**small, **config}))
    with pytest.raises(mhsa.Error, match=rf"ModelConfig::parse: .*config.json: {key}: expected"):
        mhsa.read_model_config(tmp_path)


# ---- models -------------------------------------------------------------------------------------


def assert_same_greedy(ours, hf, prompt, n):
    """Greedy continuations equal, but for a near tie in transformers' own logits where they part."""
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0).numpy()
    assert ours.shape == want.shape
    if (ours == want).all():
        return
    p = int(np.argmax(ours[0] != want[0]))
    with torch.no_grad():
        logits = hf(torch.tensor(want[:, :p])).logits[0, -1].numpy()
    gap = logits[want[0, p]] - logits[ours[0, p]]
    assert gap <= 1e-4 * np.abs(logits).max(), f"token {p}: ours {ours[0, p]}, transformers {want[0, p]} by {gap}"


def check_model(hf, path, rng, T, new_tokens):
    m = mhsa.Model.load(path)
    assert m.family == hf.config.model_type
    V = hf.config.vocab_size
    ids = rng.integers(0, V, size=(2, T))
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    got = m.forward(ids)
    assert got.shape == (2, T, V)
    assert rel(got, want) <= 1e-4
    # Through the cache: a prefill, a chunk of two, then one token at a time.
    cache = m.new_cache(2, T)
    cut = int(rng.integers(1, T - 3))
    parts = [m.extend(cache, ids[:, :cut]), m.extend(cache, ids[:, cut:cut + 2])]
    parts += [m.extend(cache, ids[:, t:t + 1]) for t in range(cut + 2, T)]
    assert rel(np.concatenate(parts, axis=1), got) <= 1e-5
    if new_tokens:
        prompt = rng.integers(0, V, size=(1, 5))
        assert_same_greedy(m.generate(prompt, max_new_tokens=new_tokens, stop_at_eos=False), hf, prompt, new_tokens)


@needs_model
@pytest.mark.parametrize("case", list(families.TINY))
def test_tiny_models_match_transformers(case, rng, tmp_path):
    config_class, kwargs, model_class = families.TINY[case]
    hf = families.build(config_class, kwargs, model_class, int(rng.integers(2**31)))
    hf.save_pretrained(tmp_path)
    check_model(hf, tmp_path, rng, T=int(rng.integers(14, 24)), new_tokens=12)


@needs_model
@pytest.mark.parametrize("case", list(families.REAL))
def test_real_shapes_match_transformers(case, rng, tmp_path):
    config_class, kwargs, model_class, shard_size = families.REAL[case]
    hf = families.build(config_class, kwargs, model_class, int(rng.integers(2**31)))
    if shard_size:
        hf.save_pretrained(tmp_path, max_shard_size=shard_size)
        assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    else:
        hf.save_pretrained(tmp_path)
    check_model(hf, tmp_path, rng, T=int(rng.integers(9, 17)), new_tokens=4)
