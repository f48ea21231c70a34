"""Speculative decoding (prompt lookup and a draft model) from Python, the CLI and the chat session.

- A tiny random Qwen2 saved by transformers: mhsa's greedy tokens with speculation equal transformers'
  greedy generate with its own prompt-lookup decoding (prompt_lookup_num_tokens) and without.
- ChatSession answers with speculation equal those without, guesses made and kept.
- The default model (SmolLM2-135M-Instruct) on a quoting prompt: greedy tokens with prompt lookup
  equal plain decoding's in every weight type, with most guesses kept; a draft model (the same
  model in 4 bits) too.
- The CLI: --draft 0 and the default give the same tokens; --json and --verbose report the guesses;
  a draft model of another vocabulary is refused, naming --model-draft.
Speed is measured in bench/speculative.py, not here.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import mhsa

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from tiny_chat_model import WORDS, write_chat_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUOTE = ("Copy this sentence exactly: The quick brown fox jumps over the lazy dog, and the lazy dog "
         "sleeps under the old oak tree while the fox runs into the forest.")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-spec")

    def edit(model, tok):  # peaked logits: the model copies, and greedy choices are not near-ties
        model.model.embed_tokens.weight *= 30
        model.lm_head.weight[tok.token_to_id("<|im_end|>")] = 0

    hf_model, tok = write_chat_dir(d, tokens=307, padding=0, max_positions=512, seed=7, edit=edit)
    return d, hf_model, tok


def test_greedy_equals_transformers_with_and_without_its_prompt_lookup(tiny, rng):
    d, hf_model, tok = tiny
    model = mhsa.Model.load(d)
    drafted = 0
    for _ in range(3):
        phrase = "".join(rng.choice(WORDS) for _ in range(12))
        ids = tok.encode(phrase * 3).ids
        n = int(rng.integers(20, 60))
        with torch.no_grad():
            plain = hf_model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)[0].tolist()
            lookup = hf_model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                                       prompt_lookup_num_tokens=6)[0].tolist()
        assert lookup == plain
        got, stats = model.generate(np.array(ids), n, stop_at_eos=False, draft_tokens=6, adaptive=False,
                                    return_stats=True)
        assert got.tolist() == plain[:len(got)] and len(got) == len(plain)
        # (A text may repeat nothing it could look up: guesses are counted over the three texts.)
        drafted += stats["drafted"]
        assert stats["forwards"] <= stats["decode_tokens"] and stats["accepted"] <= stats["drafted"]
        assert model.generate(np.array(ids), n, stop_at_eos=False).tolist() == got.tolist()
        assert model.generate(np.array(ids), n, stop_at_eos=False, draft_tokens=6).tolist() == got.tolist()
    assert drafted > 0


def test_chat_session_answers_are_unchanged(tiny, rng):
    d, _, _ = tiny
    model, tok = mhsa.Model.load(d), mhsa.Tokenizer.load(d)
    plain = mhsa.ChatSession(model, tok, max_new_tokens=40)
    fast = mhsa.ChatSession(model, tok, max_new_tokens=40, draft_tokens=5, adaptive=False)
    drafted = 0
    for _ in range(3):
        user = "".join(rng.choice(WORDS) for _ in range(8)) * 2
        assert fast.send(user) == plain.send(user)
        assert fast.finish_reason == plain.finish_reason
        drafted += fast.last_turn["drafted"]
        assert fast.last_turn["accepted"] <= fast.last_turn["drafted"]
    assert drafted > 0
    assert fast.cached_ids == plain.cached_ids
    with pytest.raises(mhsa.Error, match="ngram_max"):
        mhsa.ChatSession(model, tok, draft_tokens=5, lookup_ngram=0)


@pytest.mark.skipif(not GGUF.exists(), reason="the default model is fetched by scripts/setup.sh")
def test_default_model_greedy_tokens_are_unchanged_in_every_weight_type():
    tok = mhsa.Tokenizer.load("smollm2")
    ids = np.array(tok.apply_chat_template([{"role": "user", "content": QUOTE}], add_generation_prompt=True,
                                           tokenize=True))
    small = mhsa.Model.load("smollm2", dtype="q4_k")
    for dtype in ["f32", "bf16", "f16", "q8_0", "q4_k"]:
        model = small if dtype == "q4_k" else mhsa.Model.load("smollm2", dtype=dtype)
        plain = model.generate(ids, 48, stop_at_eos=False)
        fast, stats = model.generate(ids, 48, stop_at_eos=False, draft_tokens=7, adaptive=False, return_stats=True)
        assert fast.tolist() == plain.tolist(), dtype
        assert stats["accepted"] > stats["drafted"] / 3, (dtype, stats)
        if dtype == "q8_0":  # a draft model: the same model in 4 bits
            drafted, st = model.generate(ids, 48, stop_at_eos=False, draft_tokens=4, draft_model=small,
                                         adaptive=False, return_stats=True)
            assert drafted.tolist() == plain.tolist()
            assert st["accepted"] > st["drafted"] / 2, st


def cli(*args, check=True):
    r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, errors="replace", timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_cli_reports_and_keeps_the_tokens(tiny):
    d, _, _ = tiny
    prompt = "The quick brown fox. The quick brown fox. The quick brown fox."
    runs = {}
    for draft in ["0", None]:
        args = ["generate", "--model", d, "--prompt", prompt, "-n", 30, "--json", "--ignore-eos"]
        if draft is not None:
            args += ["--draft", draft]
        runs[draft] = json.loads(cli(*args).stdout)
    assert runs[None]["tokens"] == runs["0"]["tokens"]
    assert runs["0"]["speculation"]["drafted"] == 0 and runs["0"]["speculation"]["drafter"] == "none"
    spec = runs[None]["speculation"]
    assert spec["drafter"] == "lookup" and spec["drafted"] > 0 and 0 < spec["accepted"] <= spec["drafted"]
    r = cli("generate", "--model", d, "--prompt", prompt, "-n", 30, "--ignore-eos", "-v")
    assert "guesses kept" in r.stderr and "tokens per forward" in r.stderr
    bad = cli("generate", "--model", d, "--prompt", prompt, "--model-draft", "kjv", check=False)
    assert bad.returncode != 0 and "draft_model" in bad.stderr and "vocabulary" in bad.stderr, bad.stderr
    bad = cli("generate", "--model", d, "--prompt", prompt, "--draft", "65", check=False)
    assert bad.returncode != 0 and "--draft" in bad.stderr, bad.stderr
