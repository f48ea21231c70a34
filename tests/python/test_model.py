"""mhsa.Model against transformers' *ForCausalLM on tiny random models written by save_pretrained.

Each family's logits equal transformers' (float32, eager attention) within 1e-4 relative L2;
decoding through the cache equals recomputing; greedy generation gives transformers' tokens; the
loss and every parameter's gradient equal PyTorch float64 autograd within 1e-5 relative L2 (or
within 4x float32 autograd's own error, where that is larger).
(The broad per-family comparison, real shapes and sharded files are in test_families.py.)
"""

import json

import numpy as np
import pytest
import torch

import mhsa
from test_families import assert_same_greedy  # noqa: E402

transformers = pytest.importorskip("transformers")


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def tiny(family, rng, **over):
    """A tiny config of the family (odd sizes, grouped heads) and its transformers classes."""
    common = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-6, rope_theta=float(rng.choice([10000.0, 500000.0])),
                  tie_word_embeddings=bool(rng.integers(2)), bos_token_id=1, eos_token_id=2)
    common.update(over)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, attention_bias=bool(rng.integers(2)))
        return cfg, transformers.LlamaForCausalLM
    if family == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        return cfg, transformers.Qwen2ForCausalLM
    if family == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=16)
        return cfg, transformers.Qwen3ForCausalLM
    if family == "mistral":
        cfg = transformers.MistralConfig(**common, sliding_window=int(rng.integers(3, 9)))
        return cfg, transformers.MistralForCausalLM
    if family == "gemma2":
        common.update(head_dim=16, query_pre_attn_scalar=16, attn_logit_softcapping=float(rng.uniform(5, 30)),
                      final_logit_softcapping=float(rng.uniform(5, 30)), sliding_window=int(rng.integers(3, 9)),
                      hidden_activation="gelu_pytorch_tanh")
        cfg = transformers.Gemma2Config(**common)
        return cfg, transformers.Gemma2ForCausalLM
    if family == "olmo2":
        cfg = transformers.Olmo2Config(**common, head_dim=10, attention_bias=bool(rng.integers(2)))
        return cfg, transformers.Olmo2ForCausalLM
    if family == "phi3":  # its class's pad_token_id (32000) is outside a tiny vocabulary
        cfg = transformers.Phi3Config(**{"pad_token_id": 0, **common}, sliding_window=int(rng.integers(3, 9)))
        return cfg, transformers.Phi3ForCausalLM
    raise ValueError(family)


def fused_like_hf(grads, family):
    """mhsa's parameters (Llama's parts) fused as Phi-3's files store them: q|k|v and gate|up rows."""
    if family != "phi3":
        return grads
    out = {}
    for name, g in grads.items():
        for parts, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj")):
            if name.endswith(f".{parts[0]}.weight"):
                stem = name[: -len(f"{parts[0]}.weight")]
                out[f"{stem}{fused}.weight"] = np.concatenate([grads[f"{stem}{p}.weight"] for p in parts])
                break
            if any(name.endswith(f".{p}.weight") for p in parts):
                break
        else:
            out[name] = g
    return out


def save_tiny(family, rng, tmp_path, **over):
    cfg, cls = tiny(family, rng, **over)
    cfg._attn_implementation = "eager"
    torch.manual_seed(int(rng.integers(2**31)))
    model = cls(cfg).float().eval()
    # Norms and biases away from their initial 1 and 0, so that they count. Biases at the weights' own scale: at 5x
    # it, o_proj's and v_proj's biases outweigh the 0.02-scale embeddings, every token reaches layer 1 as nearly the
    # same vector, and its q/k gradients become a cancellation that float32 autograd itself misses at 1e-5.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith(".bias"):
                p.add_(torch.randn_like(p) * cfg.initializer_range)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "olmo2", "phi3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_cache_match_transformers(family, rng, tmp_path):
    hf = save_tiny(family, rng, tmp_path)
    m = mhsa.Model.load(tmp_path)
    assert m.family == family
    assert m.config["num_layers"] == 2
    B, T = 2, int(rng.integers(11, 24))
    ids = rng.integers(0, 97, size=(B, T))
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    got = m.forward(ids)
    assert got.shape == (B, T, 97)
    assert rel(got, want) <= 1e-4

    # The cache: a prefill, then chunks and single tokens, equal recomputing every row.
    cache = m.new_cache(B, T)
    cut = int(rng.integers(1, T - 3))
    parts = [m.extend(cache, ids[:, :cut])]
    parts.append(m.extend(cache, ids[:, cut:cut + 2]))
    for t in range(cut + 2, T):
        parts.append(m.extend(cache, ids[:, t:t + 1]))
    assert rel(np.concatenate(parts, axis=1), got) <= 1e-5


@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2", "phi3"])
def test_greedy_generation_matches_transformers(family, rng, tmp_path):
    hf = save_tiny(family, rng, tmp_path)
    m = mhsa.Model.load(tmp_path)
    prompt = rng.integers(3, 97, size=(1, 7))
    out = m.generate(prompt, max_new_tokens=10, stop_at_eos=False)
    # Equal tokens, but for a near tie in transformers' own logits where they part (random tiny
    # models have them: seed 3310628359 parts at a gap of float32 rounding).
    assert_same_greedy(out, hf, prompt, 10)


def test_generation_config_eos_stops_generation_as_in_transformers(rng, tmp_path):
    """generation_config.json's eos_token_id list (Llama 3 Instruct's <|eot_id|> is only there)
    replaces config.json's, in mhsa as in transformers' generate."""
    save_tiny("llama", rng, tmp_path)
    m = mhsa.Model.load(tmp_path)
    prompt = rng.integers(3, 97, size=(1, 7))
    free = m.generate(prompt, max_new_tokens=12, stop_at_eos=False)[0, 7:]
    stop = int(free[int(rng.integers(2, 6))])  # a token greedy decoding emits a few steps in
    first = int(np.flatnonzero(free == stop)[0])
    other = int(rng.choice(np.setdiff1d(np.arange(3, 97), free)))  # an eos that never comes
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [other, stop], "bos_token_id": 1}))
    m = mhsa.Model.load(tmp_path)
    assert m.config["eos_token_ids"] == [other, stop]
    out = m.generate(prompt, max_new_tokens=12)
    np.testing.assert_array_equal(out[0], np.concatenate([prompt[0], free[:first + 1]]))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").float().eval()
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False, pad_token_id=0).numpy()
    if out.shape != want.shape or (out != want).any():  # only a near tie in transformers' logits may part them
        n = min(out.shape[1], want.shape[1])
        p = int(np.argmax(np.append(out[0, :n] != want[0, :n], True)))
        assert p < n, f"same tokens, different lengths: {out} vs {want}"
        with torch.no_grad():
            logits = hf(torch.tensor(want[:, :p])).logits[0, -1].numpy()
        assert logits[want[0, p]] - logits[out[0, p]] <= 1e-4 * np.abs(logits).max()
    # A bad file is refused naming it.
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(mhsa.Error, match="generation_config.json: eos_token_id"):
        mhsa.Model.load(tmp_path)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma2", "olmo2", "phi3"])
def test_gradients_match_float64_autograd(family, rng, tmp_path):
    # pad_token_id: nn.Embedding's padding_idx, a row whose lookups add no gradient (Gemma 2's
    # default is 0; -2 counts from the end; "default" leaves the key out of config.json).
    pad = [None, 0, 5, -2, "default"][int(rng.integers(5))]
    hf = save_tiny(family, rng, tmp_path, **({} if pad == "default" else {"pad_token_id": pad}))
    m = mhsa.Model.load(tmp_path)
    row = hf.model.embed_tokens.padding_idx
    assert m.config["pad_token_id"] == (-1 if row is None else row)
    B, T = 2, int(rng.integers(9, 17))
    ids = rng.integers(0, 97, size=(B, T))
    if row is not None:
        ids[0, 1] = ids[1, -1] = row
    targets = rng.integers(-1, 97, size=(B, T))
    loss, grads = m.loss_and_grad(ids, targets)

    def autograd(dtype):
        ref = hf.to(dtype)
        ref.zero_grad()
        logits = ref(torch.tensor(ids)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), torch.tensor(targets).reshape(-1),
                                                 ignore_index=-1)
        loss.backward()
        return loss.item(), {n: p.grad.double().numpy().copy() for n, p in ref.named_parameters()}

    # float32 autograd's own error bounds ours where it is above 1e-5/4: OLMo-2's full-width q/k
    # norms make its q/k gradients a cancellation (a normalised vector's gradient has its
    # component along the vector taken out) that float32 arithmetic resolves to ~1e-5 only.
    _, grads32 = autograd(torch.float32)
    want, grads64 = autograd(torch.float64)
    named = dict(hf.named_parameters())
    assert abs(loss - want) <= 1e-5 * abs(want)
    assert set(grads) == set(m.parameter_names)
    grads = fused_like_hf(grads, family)
    assert set(grads) == set(named)
    for name, g in grads.items():
        assert g.shape == tuple(named[name].shape), name
        assert rel(g, grads64[name]) <= max(1e-5, 4 * rel(grads32[name], grads64[name])), name


def test_errors_name_the_model(rng, tmp_path):
    save_tiny("llama", rng, tmp_path)
    m = mhsa.Model.load(tmp_path)
    with pytest.raises(mhsa.Error, match=r"Model::extend: ids\[0, 1\]: expected a token id in \[0, 97\), got 97"):
        m.forward([[1, 97]])
    with pytest.raises(mhsa.Error, match=r"Model::new_cache: max_tokens: expected a count in \[1, 64\]"):
        m.new_cache(1, 65)
    with pytest.raises(mhsa.Error, match=r"Model.load|Model::load"):
        mhsa.Model.load(tmp_path / "nope")


def test_random_model_from_a_config_dict(rng):
    config = dict(model_type="llama", vocab_size=61, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                  num_attention_heads=5, num_key_value_heads=1, max_position_embeddings=32)
    seed = int(rng.integers(2**31))
    a, b, c = mhsa.Model.random(config, seed), mhsa.Model.random(config, seed), mhsa.Model.random(config, seed + 1)
    assert a.family == "llama" and a.config["num_kv_heads"] == 1 and a.config["head_dim"] == 8
    ids = rng.integers(0, 61, size=(2, int(rng.integers(3, 20))))
    la = a.forward(ids)
    assert la.shape == (*ids.shape, 61) and np.isfinite(la).all()
    np.testing.assert_array_equal(la, b.forward(ids))
    assert not np.array_equal(la, c.forward(ids))
    with pytest.raises(mhsa.Error, match="config: num_attention_heads"):
        mhsa.Model.random(dict(config, num_attention_heads=7), seed)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_profile_counts_this_threads_forwards_phase_by_phase(family, rng, tmp_path):
    import threading

    save_tiny(family, rng, tmp_path)
    m = mhsa.Model.load(tmp_path)
    layers = m.config["num_layers"]
    ids = rng.integers(3, 97, size=(1, int(rng.integers(3, 9))))
    plain = m.forward(ids)
    n = int(rng.integers(2, 7))
    with mhsa.profile() as p:
        profiled = m.forward(ids)
        m.generate(ids, max_new_tokens=n, stop_at_eos=False)  # a prefill, then n - 1 cached steps
        other = threading.Thread(target=m.forward, args=(ids,))  # another thread's: not counted
        other.start()
        other.join()
    np.testing.assert_array_equal(profiled, plain)  # profiling changes no bit
    assert p.forwards == 1 + n and p.layers == layers
    # norm: four timed stretches a layer (before attention and MLP, and after each, where Gemma 2
    # has its post-norms and the others nothing to time)
    want = dict(embed=1, norm=4 * layers, qkv=layers, attention=layers, out_proj=layers, mlp_in=layers,
                activation=layers, mlp_out=layers, residual=2 * layers, head=1)
    assert p.calls == {k: v * p.forwards for k, v in want.items()}
    assert list(p.seconds) == list(mhsa.PHASES) and all(s > 0 for s in p.seconds.values())
    text = str(p)
    assert text.startswith(f"{1 + n} forwards of {layers} layers") and all(k in text for k in mhsa.PHASES)
    with pytest.raises(mhsa.Error, match="no other profile open on this thread"):
        with p:
            with mhsa.profile():  # would restart the outer one's totals
                pass
    with mhsa.profile() as q:  # a new profile starts from zero; the old one's forwards are gone
        pass
    assert q.forwards == 0 and not any(q.calls.values()) and str(q) == "mhsa.profile: no forward ran"


def test_generate_takes_openais_penalties_and_logit_bias():
    """Model.generate's presence_penalty, frequency_penalty and logit_bias are the CLI's (and the
    server's): the default model's tokens equal `mhsa generate`'s with the same options; +100 forces a
    token; bad ids are errors naming logit_bias."""
    import subprocess

    import test_default_model as d

    m = mhsa.Model.load(d.MODEL)
    prompt = "In the beginning God created"
    ids = np.frombuffer(prompt.encode(), np.uint8).astype(np.int64)
    assert list(m.generate(ids, 5, logit_bias={97: 100.0})[len(ids):]) == [97] * 5
    for pres, freq, bias in [(0.0, 2.0, {}), (1.5, 0.5, {101: -100.0}), (-1.0, 1.0, {32: 3.0, 10: -5.0})]:
        got = m.generate(ids, 24, presence_penalty=pres, frequency_penalty=freq, logit_bias=bias, stop_at_eos=False)
        args = [str(d.CLI), "generate", "--prompt", prompt, "-n", "24", "--json", "--ignore-eos",
                "--presence-penalty", str(pres), "--frequency-penalty", str(freq)]
        for k, v in bias.items():
            args += ["--logit-bias", f"{k}={v}"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert list(got[len(ids):]) == json.loads(r.stdout)["tokens"], (pres, freq, bias)
    plain = m.generate(ids, 24, stop_at_eos=False)
    assert list(m.generate(ids, 24, frequency_penalty=2.0, stop_at_eos=False)) != list(plain)
    for bad in ({256: 1.0}, {-1: 1.0}, {2**40: 1.0}):
        with pytest.raises(mhsa.Error, match="logit_bias"):
            m.generate(ids, 2, logit_bias=bad)
    with pytest.raises(mhsa.Error, match="presence_penalty"):
        m.generate(ids, 2, presence_penalty=float("nan"))
