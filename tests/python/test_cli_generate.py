"""`mhsa generate` end to end: a Hugging Face directory written by transformers (random weights,
GPT-2's real vocabulary and tokenizer files), the CLI run as a user runs it, and transformers'
greedy generation on the same ids as the oracle."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2-tiny")
    torch.manual_seed(1234)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=96)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # a livelier random model: varied tokens rather than one repeated
        model.transformer.wte.weight.mul_(20.0)
    model.save_pretrained(d, safe_serialization=True)
    shutil.copy(TOKENIZER / "encoder.json", d / "vocab.json")
    shutil.copy(TOKENIZER / "vocab.bpe", d / "merges.txt")
    return d, model


def run(*args, check=True):
    r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def hf_greedy(model, ids, n):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=50256,
                         attention_mask=torch.ones((1, len(ids)), dtype=torch.long))
    return out[0, len(ids):].tolist()


def test_generate_json_matches_transformers(model_dir):
    d, model = model_dir
    r = run("generate", "--model", d, "--prompt", "The quick brown fox", "-n", 24, "--json", "--ignore-eos")
    j = json.loads(r.stdout)
    assert j["prompt_tokens"] == len(j["prompt_ids"]) == 4
    assert j["prompt_ids"] == [464, 2068, 7586, 21831]  # GPT-2's ids for the prompt
    assert j["tokens"] == hf_greedy(model, j["prompt_ids"], 24)
    assert j["prefill_tokens_per_s"] > 0 and j["decode_tokens_per_s"] > 0
    import mhsa  # the text is the tokens decoded
    tok = mhsa.Tokenizer.load(TOKENIZER)
    assert j["text"] == tok.decode(j["tokens"])


def test_streamed_text_equals_the_json_text(model_dir):
    d, _ = model_dir
    streamed = run("generate", "--model", d, "--prompt", "Once upon a time", "-n", 30, "--ignore-eos").stdout
    j = json.loads(run("generate", "--model", d, "--prompt", "Once upon a time", "-n", 30, "--ignore-eos",
                       "--json").stdout)
    assert streamed == j["text"] + "\n"


def test_stop_string_ends_generation_and_is_not_printed(model_dir):
    d, _ = model_dir
    full = json.loads(run("generate", "--model", d, "--prompt", "Hello", "-n", 30, "--ignore-eos", "--json").stdout)
    text = full["text"]
    assert len(text) > 12
    stop = text[8:11]
    before = text[:text.find(stop)]
    r = run("generate", "--model", d, "--prompt", "Hello", "-n", 30, "--ignore-eos", "--stop", stop)
    assert r.stdout == before + "\n"
    j = json.loads(run("generate", "--model", d, "--prompt", "Hello", "-n", 30, "--ignore-eos", "--stop", stop,
                       "--json").stdout)
    assert j["text"] == before and len(j["tokens"]) < len(full["tokens"])


def test_sampling_is_reproducible_with_a_seed(model_dir):
    d, _ = model_dir
    args = ["generate", "--model", d, "--prompt", "A", "-n", 16, "--temperature", 4.0, "--top-k", 400, "--top-p",
            0.99, "--json", "--ignore-eos"]  # hot enough that the peaked random model varies
    a = json.loads(run(*args, "--seed", 3).stdout)["tokens"]
    assert a == json.loads(run(*args, "--seed", 3).stdout)["tokens"]
    assert a != json.loads(run(*args, "--seed", 4).stdout)["tokens"]


def test_bad_requests_are_clear_errors(model_dir, tmp_path):
    d, _ = model_dir
    r = run("generate", "--model", d, "--prompt", "Hi", "-n", 200, "--ignore-eos", check=False)  # as far as it goes
    assert r.returncode == 0
    assert r.stderr.endswith("mhsa generate: stopped at the model's context of 96 tokens (1 prompt + 95 new; "
                             "-n asked for 200)\n"), r.stderr
    r = run("generate", "--model", tmp_path, "--prompt", "Hi", check=False)
    assert r.returncode == 2 and "config.json: expected a readable config.json, got no such file" in r.stderr
    r = run("generate", "--model", d, "--prompt", "Hi", "--top-p", 1.5, check=False)
    assert r.returncode == 2 and r.stderr.startswith("mhsa: error: --top-p: expected a number in [0, 1], got 1.5\n")
    r = run("generate", "--model", d, "--prompt", " the" * 120, check=False)  # the prompt, not -n, is too long
    assert r.returncode == 2 and ("--prompt: expected at most 95 tokens (the model's context is 96 tokens, less one "
                                  "for a new token), got 120 tokens") in r.stderr


def test_python_generate_agrees_with_the_cli(model_dir):
    import mhsa
    d, _ = model_dir
    j = json.loads(run("generate", "--model", d, "--prompt", "In 1905,", "-n", 10, "--json", "--ignore-eos").stdout)
    seq = mhsa.GPT2.load(d).generate(np.array([j["prompt_ids"]]), 10, stop_at_eos=False)
    assert seq[0, j["prompt_tokens"]:].tolist() == j["tokens"]
