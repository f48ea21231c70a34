"""A model whose embedding has more rows than its tokenizer has tokens, as Qwen2.5's and Qwen3's
(config.json vocab_size 151936, tokenizer.json 151665 ids): a tiny random Qwen2ForCausalLM saved by
transformers with a padded vocabulary and a byte-level BPE tokenizer.json trained with `tokenizers`.
The head's rows for the padding are scaled up so that greedy generation emits such ids; they count
as tokens but have no text, as transformers' decode skips them. `mhsa generate` must give
transformers' greedy tokens and decode's text, `mhsa chat --messages` transformers'
apply_chat_template + generate; a tokenizer larger than the model's vocabulary stays an error.
Random prompts and padding each run; MHSA_TEST_SEED reproduces one."""

import json
import os
import random
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
from tiny_chat_model import WORDS, hf_tokenizer, write_chat_dir  # noqa: E402


@pytest.fixture(scope="module")
def seed():
    return int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))


@pytest.fixture
def rng(request, seed):
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, seed):
    d = tmp_path_factory.mktemp("qwen-padded")

    def edit(model, tok):  # the padding's ids among the greedy tokens
        model.lm_head.weight[tok.get_vocab_size():].mul_(3.0)

    model, tok = write_chat_dir(d, tokens=311, padding=random.Random(seed).randint(5, 60), max_positions=256,
                                seed=seed, edit=edit)
    return d, model, hf_tokenizer(d), tok.get_vocab_size()


def run(*args, stdin=None):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, timeout=300, input=stdin)


def prompt(rng):
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))).strip() or "The"


def test_generate_equals_transformers_with_padding_ids(qwen_dir, rng):
    d, model, hf, n = qwen_dir
    emitted_padding = False
    for _ in range(3):
        p = prompt(rng)
        steps = rng.randint(8, 40)
        r = run("generate", "-t", "1", "--model", d, "--prompt", p, "-n", steps, "--json", "--ignore-eos")
        assert r.returncode == 0, r.stderr.decode()
        out = json.loads(r.stdout)
        ids = hf(p)["input_ids"]
        assert out["prompt_ids"] == ids
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(ids):].tolist()
        assert out["tokens"] == want, p
        assert out["text"] == hf.decode(want)
        assert max(want) < model.config.vocab_size
        emitted_padding |= max(want) >= n
        # The streamed text (no --json) is the same: its exact bytes, a cut character as the lossy decode's U+FFFD.
        r = run("generate", "-t", "1", "--model", d, "--prompt", p, "-n", steps, "--no-echo", "--ignore-eos")
        assert r.returncode == 0 and r.stdout.decode(errors="replace") == hf.decode(want) + "\n", r.stderr.decode()
    assert emitted_padding, "the test's model never chose a padding id"


def test_chat_messages_equals_transformers(qwen_dir, rng):
    d, model, hf, n = qwen_dir
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt(rng)}]
    steps = rng.randint(8, 40)
    r = run("chat", "-t", "1", "--model", d, "--messages", "-", "--json", "-n", steps,
            stdin=json.dumps(messages).encode())
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # newer transformers give a BatchEncoding
        ids = ids["input_ids"]
    with torch.no_grad():
        new = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,
                             eos_token_id=hf.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0)[0, len(ids):].tolist()
    end = hf.convert_tokens_to_ids("<|im_end|>")
    answer = new[:new.index(end)] if end in new else new
    assert out["prompt_tokens"] == len(ids)
    assert out["completion_tokens"] == len(answer)
    assert out["content"] == hf.decode(answer, skip_special_tokens=True)
    assert out["finish_reason"] == ("stop" if end in new else "length")


def test_a_tokenizer_larger_than_the_model_is_an_error(qwen_dir, tmp_path):
    d, model, hf, n = qwen_dir
    big = tmp_path / "big"
    shutil.copytree(d, big)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    V = model.config.vocab_size
    tok.add_tokens([f"<extra_{i}>" for i in range(V - n + 1)])
    tok.save(str(big / "tokenizer.json"))
    for args in (["generate", "--prompt", "Hello"], ["chat", "--messages", "-"]):
        r = run(*args, "-t", "1", "--model", big, stdin=b'[{"role": "user", "content": "Hi"}]')
        assert r.returncode == 2
        assert r.stderr.decode() == (f"mhsa: error: --model: expected a tokenizer of at most the model's {V} tokens "
                                     f"(vocab_size in config.json), got one of {V + 1} tokens in '{big}'\n")
