"""The default model and quality measurement.

- SmolLM2-135M-Instruct (models/smollm2/, fetched by scripts/setup.sh) is what `mhsa chat`,
  `generate`, `serve`, `explain` and `mhsa.Model.load()` run without a model: it answers a factual
  question through `mhsa chat --prompt`; a missing file is an error that names scripts/setup.sh; a
  file whose SHA-256 differs is refused, also after a good one was remembered; "kjv" names the model
  mhsa trained itself.
- Its float32 logits equal transformers' on the same GGUF file (dequantised by transformers) to
  1e-4 relative.
- `mhsa perplexity` / Model.perplexity follow llama-perplexity's method, checked against that
  method computed here in float64 from mhsa's own logits (chunks, the scored second halves, BOS,
  the chunk limit, the ± error), and refuse what it refuses.
- Model.token_logprobs is the float64 log-softmax of the logits before each token.
"""

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import mhsa

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENCES = [Path("/usr/share/common-licenses/GPL-3"), Path("/usr/share/common-licenses/Apache-2.0")]

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 211, "hidden_size": 48,
         "intermediate_size": 77, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
         "max_position_embeddings": 256}


def env(**extra):
    """The environment without conftest's MHSA_MODEL=kjv: the real default applies."""
    e = {k: v for k, v in os.environ.items() if k not in ("MHSA_MODEL", "MHSA_MODELS_DIR")}
    e.update(extra)
    return e


def run(*args, check=True, **extra):
    r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=600, env=env(**extra))
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def installed():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: scripts/setup.sh downloads it")
    return GGUF


def test_chat_prompt_answers_a_factual_question(installed):
    r = run("chat", "--prompt", "What is the capital of France?", "-n", "32", "--json", "-t", "2")
    out = json.loads(r.stdout)
    assert "Paris" in out["content"], out
    assert out["finish_reason"] == "stop" and out["prompt_tokens"] > 5


def test_without_a_model_every_command_runs_the_default(installed, monkeypatch):
    r = run("generate", "--prompt", "The capital of Italy is", "-n", "4", "--json", "-t", "2")
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == 5  # SmolLM2's BPE, not bytes
    monkeypatch.delenv("MHSA_MODEL", raising=False)
    model = mhsa.Model.load()
    assert model.family == "llama" and model.config["vocab_size"] == 49152
    assert model.dtype == next(m["dtype"] for m in mhsa.named_models() if m["name"] == "smollm2")
    assert mhsa.Tokenizer.load().encode("The capital of Italy is") == mhsa.Tokenizer.load(GGUF).encode(
        "The capital of Italy is")
    assert [m["name"] for m in mhsa.named_models()][:2] == ["smollm2", "kjv"]
    assert mhsa.resolve_model() == GGUF and mhsa.resolve_model("kjv") == ROOT / "models" / "default"
    assert mhsa.Model.load("kjv").config["vocab_size"] == 256 and mhsa.Tokenizer.load("kjv").vocab_size == 256
    # A file or directory named like a model wins over the name.
    monkeypatch.chdir(ROOT / "models")
    assert mhsa.resolve_model("default") == Path("default")


def test_a_missing_default_model_names_the_setup_script(tmp_path, monkeypatch):
    r = run("chat", "--prompt", "hi", check=False, MHSA_MODELS_DIR=tmp_path)
    assert r.returncode == 2
    assert "--model: expected the smollm2 model" in r.stderr and "scripts/setup.sh" in r.stderr
    assert str(tmp_path / "smollm2" / GGUF.name) in r.stderr
    monkeypatch.delenv("MHSA_MODEL", raising=False)
    monkeypatch.setenv("MHSA_MODELS_DIR", str(tmp_path))
    with pytest.raises(mhsa.Error, match="run scripts/setup.sh"):
        mhsa.Model.load()
    r = run("generate", "--model", "kjv", "--prompt", "x", "-n", "1", check=False, MHSA_MODELS_DIR=tmp_path)
    assert r.returncode == 2 and "expected the kjv model" in r.stderr


def test_a_changed_model_file_is_refused(installed, tmp_path, monkeypatch):
    copy = tmp_path / "smollm2" / GGUF.name
    copy.parent.mkdir()
    data = bytearray(GGUF.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(data)
    r = run("tokenize", "hello", check=False, MHSA_MODELS_DIR=tmp_path)
    assert r.returncode == 2 and f"with SHA-256 {SHA256}, got one with SHA-256" in r.stderr, r.stderr
    # The intact file is accepted and its checksum remembered beside it...
    shutil.copyfile(GGUF, copy)
    r = run("tokenize", "hello", MHSA_MODELS_DIR=tmp_path)
    assert r.stdout.split() == [str(i) for i in mhsa.Tokenizer.load(GGUF).encode("hello")]
    memo = Path(str(copy) + ".sha256").read_text().split()
    assert memo[0] == SHA256 and int(memo[1]) == copy.stat().st_size
    # ...for as long as the file is unchanged: a changed one is hashed again and refused.
    with open(copy, "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 1_000_000))
    monkeypatch.delenv("MHSA_MODEL", raising=False)
    monkeypatch.setenv("MHSA_MODELS_DIR", str(tmp_path))
    with pytest.raises(mhsa.Error, match="SHA-256"):
        mhsa.Tokenizer.load()


def test_f32_logits_equal_transformers_on_the_gguf_file(installed):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    hf = transformers.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, torch_dtype=torch.float32)
    tok = mhsa.Tokenizer.load(GGUF)
    model = mhsa.Model.load(GGUF, dtype="f32")
    assert model.dtype == "f32"
    for prompt in ["The capital of France is", "def fibonacci(n):\n    if n < 2:",
                   "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"]:
        ids = tok.encode(prompt, allow_special=True)
        ours = model.forward(np.array(ids))
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0].numpy()
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        assert err < 1e-4, (prompt, err)


def llama_perplexity_in_float64(model, ids, ctx, chunks=0, bos=-1):
    """llama-perplexity's method, here in float64 from the model's float32 logits."""
    n_chunks = len(ids) // ctx if chunks == 0 else min(chunks, len(ids) // ctx)
    nll, running = [], []
    for c in range(n_chunks):
        chunk = np.array(ids[c * ctx:(c + 1) * ctx])
        if bos >= 0:
            chunk[0] = bos
        logits = model.forward(chunk).astype(np.float64)
        for j in range(ctx // 2, ctx - 1):
            row = logits[j]
            top = row.max()
            nll.append(top + math.log(np.exp(row - top).sum()) - row[ids[c * ctx + j + 1]])
        running.append(math.exp(np.mean(nll)))
    nll = np.array(nll)
    mean = nll.mean()
    ppl = math.exp(mean)
    var = (nll * nll).mean() - mean * mean
    return ppl, ppl * math.sqrt(var / (len(nll) - 1)), running, len(nll)


@pytest.mark.parametrize("ctx, chunks, bos", [(16, 0, -1), (37, 3, -1), (8, 0, 5), (4, 2, -1)])
def test_perplexity_is_llama_perplexitys_method(rng, ctx, chunks, bos):
    model = mhsa.Model.random(LLAMA, seed=int(rng.integers(1 << 31)))
    ids = rng.integers(0, LLAMA["vocab_size"], 5 * ctx + int(rng.integers(ctx))).tolist()
    got = model.perplexity(ids, context=ctx, chunks=chunks, bos=bos)
    ppl, err, running, scored = llama_perplexity_in_float64(model, ids, ctx, chunks, bos)
    assert got["scored_tokens"] == scored == got["chunks"] * (ctx - 1 - ctx // 2)
    assert abs(got["ppl"] - ppl) <= 1e-12 * ppl
    assert abs(got["ppl_error"] - err) <= 1e-9 * err
    np.testing.assert_allclose(got["running"], running, rtol=1e-12)
    assert abs(got["nll_mean"] - math.log(ppl)) < 1e-12


def test_perplexity_refuses_what_llama_perplexity_refuses(rng):
    model = mhsa.Model.random(LLAMA, seed=1)
    ids = rng.integers(0, LLAMA["vocab_size"], 100).tolist()
    with pytest.raises(mhsa.Error, match=r"perplexity: ids: expected at least 128 tokens \(twice the context of 64\), got 100"):
        model.perplexity(ids, context=64)
    with pytest.raises(mhsa.Error, match=r"context: expected a number of tokens in \[4, 256\]"):
        model.perplexity(ids, context=3)
    with pytest.raises(mhsa.Error, match=r"context: expected a number of tokens in \[4, 256\]"):
        model.perplexity(ids * 10, context=300)
    with pytest.raises(mhsa.Error, match=r"ids\[3\]: expected a token id in \[0, 211\), got 211"):
        model.perplexity(ids[:3] + [211] + ids[4:], context=16)


def test_perplexity_command_on_the_kjv_model(tmp_path):
    text = (LICENCES[1].read_bytes() * 2)[:2999] + b"."  # no trailing newline (the command drops one, as llama.cpp)
    (tmp_path / "t.txt").write_bytes(text)
    r = run("perplexity", "--model", "kjv", "-f", tmp_path / "t.txt", "-c", "256", "--json", "-t", "1")
    out = json.loads(r.stdout)
    model = mhsa.Model.load("kjv")
    ids = list(text)  # bytes: the model's tokenizer
    ppl, err, running, scored = llama_perplexity_in_float64(model, ids, 256)
    assert out["chunks"] == 11 and out["scored_tokens"] == scored and out["bos"] is False and out["dtype"] == "f32"
    assert abs(out["ppl"] - ppl) <= 1e-9 * ppl and abs(out["ppl_error"] - err) <= 1e-6 * err
    assert "[11/11]" in r.stderr  # progress
    r = run("perplexity", "--model", "kjv", "-f", tmp_path / "t.txt", "-c", "256", "--chunks", "2", "-t", "1")
    assert r.stdout.startswith("PPL = ") and "2 chunks of 256 tokens, 254 scored" in r.stdout
    r = run("perplexity", "--model", "kjv", "-f", tmp_path / "t.txt", "-c", "2000", check=False)
    assert r.returncode == 2 and "expected a text of at least 4000 tokens (twice --context), got 3000 tokens" in r.stderr
    r = run("perplexity", "--model", "kjv", "-f", tmp_path / "absent.txt", check=False)
    assert r.returncode == 2 and "--file: expected a readable file" in r.stderr


def test_perplexity_of_the_default_model_on_a_licence_text(installed):
    r = run("perplexity", "-f", LICENCES[1], "-c", "256", "--chunks", "3", "--json", "-t", "2", "--dtype", "f32")
    out = json.loads(r.stdout)
    model = mhsa.Model.load(GGUF, dtype="f32")
    ids = mhsa.Tokenizer.load(GGUF).encode(LICENCES[1].read_text().removesuffix("\n"))
    ppl, _, _, _ = llama_perplexity_in_float64(model, ids, 256, chunks=3)
    assert out["bos"] is False and out["chunks"] == 3
    assert abs(out["ppl"] - ppl) <= 1e-9 * ppl
    assert 5 < out["ppl"] < 40  # an English legal text for a 135M model; random weights give ~49152


def test_token_logprobs_are_the_log_softmax_before_each_token(rng):
    model = mhsa.Model.random(dict(LLAMA, max_position_embeddings=1024), seed=int(rng.integers(1 << 31)))
    ids = rng.integers(0, LLAMA["vocab_size"], 700).tolist()  # three of its 256-token chunks
    got = model.token_logprobs(ids)
    logits = model.forward(np.array(ids)).astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    assert np.isnan(got[0])
    np.testing.assert_allclose(got[1:], logp[np.arange(len(ids) - 1), ids[1:]], rtol=0, atol=1e-5)
