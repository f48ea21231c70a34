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
CHATML = (ROOT / "tests" / "data" / "chat_templates" / "chatml.jinja").read_text()
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Hello", " world", "!",
         " é", " 中文", " 42"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def seed():
    return int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))


@pytest.fixture
def rng(request, seed):
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    d = tmp_path_factory.mktemp("qwen-padded")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=311, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["".join(WORDS)] * 20 + ["user assistant system"] * 5, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    n = tok.get_vocab_size()
    padded = n + random.Random(seed).randint(5, 60)
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=padded, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=tok.token_to_id("<|im_end|>"), tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # varied tokens, and the padding's ids among them
        model.model.embed_tokens.weight.mul_(20.0)
        model.lm_head.weight[n:].mul_(3.0)
    model.save_pretrained(d, safe_serialization=True)
    # PreTrainedTokenizerFast: the tokenizer.json as written (transformers 5's AutoTokenizer would build a
    # Qwen2Tokenizer with Qwen's own pre-tokenizer for a qwen2 config, not this file's).
    return d, model, transformers.PreTrainedTokenizerFast.from_pretrained(str(d)), n


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
