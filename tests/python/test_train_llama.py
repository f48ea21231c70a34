"""`mhsa train --arch llama`: a Llama-family model (rotary positions, RMSNorm, SwiGLU, grouped-query
heads) trained from scratch with the same progress, checkpoints, resume and log as GPT-2, into a
directory that transformers' LlamaForCausalLM loads: the same logits as mhsa.Model on it, and the
held-out loss the trainer reported. Tiny models, a few steps: seconds each."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import mhsa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import B, CLI, ROOT, TINY, T, state, text, train  # noqa: E402,F401


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_a_stopped_llama_run_resumes_bit_for_bit(text, tmp_path, rng):
    seed, theta = int(rng.integers(1000)), float(rng.choice([10000.0, 500000.0]))
    args = ["--data", text, *TINY, "--steps", 12, "--seed", seed, "--rope-theta", theta]
    r = train(*args, "--out", tmp_path / "whole")
    assert "step 12/12" in r.stderr and "tok/s" in r.stderr and "ETA" in r.stderr and "done at step 12" in r.stdout
    train(*args, "--out", tmp_path / "parts", "--stop-after", 5)
    r = train("--data", text, "--out", tmp_path / "parts", "--resume")  # the checkpoint says it is a Llama
    assert "done at step 12" in r.stdout
    (ha, oa, ta), (hb, ob, tb) = state(tmp_path / "whole"), state(tmp_path / "parts")
    assert oa == ob and oa["arch"] == "llama" and oa["kv_heads"] == 2 and oa["rope_theta"] == theta
    assert ha == hb and len(ha["loss"]) == 12  # every step's loss and every validation, exactly
    assert ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)  # weights and AdamW moments
    assert "param.model.layers.1.self_attn.k_proj.weight" in ta and "adam_v.model.norm.weight" in ta
    assert ta["param.model.layers.1.self_attn.k_proj.weight"].shape == (2 * 8, 32)  # 2 kv heads of 8
    assert ha["val_bpb"][-1][1] < ha["val_bpb"][0][1]  # it learns
    assert (tmp_path / "parts" / "loss_curve.svg").exists()
    log = [json.loads(line) for line in (tmp_path / "parts" / "train_log.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in log if "loss" in x] == ha["loss"]


@pytest.mark.parametrize("untied", [False, True])
def test_the_checkpoint_is_a_llama_transformers_loads(text, tmp_path, rng, untied):
    transformers = pytest.importorskip("transformers")
    import torch
    out, theta, mlp = tmp_path / "m", float(rng.uniform(1e3, 1e5)), int(rng.integers(20, 70))
    train("--data", text, "--out", out, *TINY, "--steps", 6, "--seed", int(rng.integers(1000)), "--rope-theta", theta,
          "--mlp", mlp, *(["--untied-head"] if untied else []))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] == (not untied)
    hf, info = transformers.LlamaForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32,
                                                             output_loading_info=True)
    hf.eval()
    assert not any(info.values()), info  # every tensor used, none missing, none unexpected
    c = hf.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.max_position_embeddings, c.vocab_size) == (32, mlp, 2, 4, 2, T, 256)
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == (not untied)

    ours = mhsa.Model.load(out)
    ids = rng.integers(0, 256, size=(2, T))
    with torch.no_grad():
        want = hf(torch.as_tensor(ids)).logits.numpy()
    assert rel(ours.forward(ids), want) <= 1e-4

    # The held-out loss the trainer reported at its last step: every 24-byte window of the last
    # 4% of the text (20 of them, fewer than validation's 8 batches of 3), in bits per byte.
    data = np.frombuffer(text.read_bytes(), np.uint8).astype(np.int64)
    held_out = data[len(data) - round(len(data) * 0.04):]
    windows = (len(held_out) - 1) // T
    assert windows <= 8 * B
    x = np.stack([held_out[w * T:w * T + T] for w in range(windows)])
    y = np.stack([held_out[w * T + 1:w * T + T + 1] for w in range(windows)])
    with torch.no_grad():
        logits = hf(torch.as_tensor(x)).logits.double()
        nats = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), torch.as_tensor(y).reshape(-1)).item()
    history, _, _ = state(out)
    assert history["val_bpb"][-1][0] == 6
    assert history["val_bpb"][-1][1] == pytest.approx(nats / np.log(2), rel=1e-5)


@pytest.mark.parametrize("key,value", [("hidden_size", 64), ("num_key_value_heads", 4), ("rope_theta", 1.0),
                                       ("tie_word_embeddings", False), ("model_type", "gpt2")])
def test_resume_checks_the_llama_checkpoint_against_its_config(text, tmp_path, key, value):
    out = tmp_path / "m"
    train("--data", text, "--out", out, *TINY, "--steps", 4, "--stop-after", 2)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, **{key: value})))
    r = train("--data", text, "--out", out, "--resume", check=False)
    assert r.returncode == 2 and "config.json: expected the shape of train_state.safetensors" in r.stderr, r.stderr
    assert key in r.stderr


@pytest.mark.parametrize("args,says", [
    (["--kv-heads", 2], "arch: expected llama for the options kv_heads, mlp, rope_theta and tied_head"),
    (["--untied-head"], "got gpt2 with kv_heads 0, mlp 0, rope_theta 10000, tied_head false"),
    (["--arch", "llama", "--heads", 4, "--kv-heads", 3], "kv_heads: expected a count dividing heads (4)"),
    (["--arch", "llama", "--embd", 12, "--heads", 4], "expected an even head width embd / heads"),
    (["--arch", "bert"], "--arch"),
])
def test_llama_options_out_of_place_are_refused(text, tmp_path, args, says):
    r = train("--data", text, "--out", tmp_path / "m", "--steps", 2, *map(str, args), check=False)
    assert r.returncode == 2 and says in r.stderr and "step 1/" not in r.stderr, r.stderr
