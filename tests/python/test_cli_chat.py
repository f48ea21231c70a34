"""`mhsa chat` under a real pseudo-terminal (pexpect), and its --messages form for scripts.

The model directory: a random Llama (written with NumPy + safetensors, no transformers needed) with a
byte-level BPE tokenizer.json trained by `tokenizers` and the ChatML template (tests/data/chat_templates).
The head's rows for the special tokens are zero, so greedy answers never end by themselves: an
answer runs to --max-new-tokens, and a big --max-new-tokens gives an answer long enough to
interrupt. One thread each (the tests run beside others on few cores). Each turn's --verbose line tells how many prompt tokens were evaluated and how many were
reused from the KV cache; answers in the terminal must equal the --messages form's (which starts
from an empty cache) for the same conversation.
"""

import json
import os
import re
import secrets
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pexpect = pytest.importorskip("pexpect")
tokenizers = pytest.importorskip("tokenizers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
CHATML = (ROOT / "tests" / "data" / "chat_templates" / "chatml.jinja").read_text()
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Hello", " world", "!",
         " é", " 中文", " 42", " story", " tell", " me", " a"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
STATS = re.compile(r"mhsa chat: prompt (\d+) tokens: (\d+) evaluated \([^)]*\), (\d+) reused from the cache; "
                   r"(\d+) generated at [\d.]+ tokens/s; finish: (\w+)")


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


def write_model(d, vocab, context, seed, hidden=128, layers=3, heads=4, kv_heads=2, inter=256):
    g = np.random.default_rng(seed)
    w = lambda *shape: (g.standard_normal(shape) * 0.08).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(vocab, hidden) * 20, "model.norm.weight": np.ones(hidden, np.float32)}
    hd = hidden // heads
    for i in range(layers):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": np.ones(hidden, np.float32),
              p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
              p + "self_attn.q_proj.weight": w(hidden, hidden), p + "self_attn.k_proj.weight": w(kv_heads * hd, hidden),
              p + "self_attn.v_proj.weight": w(kv_heads * hd, hidden), p + "self_attn.o_proj.weight": w(hidden, hidden),
              p + "mlp.gate_proj.weight": w(inter, hidden), p + "mlp.up_proj.weight": w(inter, hidden),
              p + "mlp.down_proj.weight": w(hidden, inter)}
    head = w(vocab, hidden) * 10
    head[: len(SPECIALS)] = 0  # no end of turn: greedy answers run to --max-new-tokens
    t["lm_head.weight"] = head
    safetensors_numpy.save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "max_position_embeddings": context, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "eos_token_id": 2, "bos_token_id": 0}))


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    d = tmp_path_factory.mktemp("chat-model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["".join(WORDS)] * 20 + ["user assistant system"] * 5, trainer)
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2]
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    write_model(d, tok.get_vocab_size(), 65536, seed=secrets.randbits(32))
    return d


def variant(src, dst, context=None, template=True):
    """A copy of the model directory with another context length or without a chat template."""
    shutil.copytree(src, dst)
    if context is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["max_position_embeddings"] = context
        (dst / "config.json").write_text(json.dumps(cfg))
    if not template:
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        del cfg["chat_template"]
        (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def spawn(*args):
    child = pexpect.spawn(str(CLI), ["chat", "-t", "1", *map(str, args)], encoding="utf-8", timeout=60,
                          dimensions=(24, 1000))
    child.expect_exact("> ")
    return child


def turn(child, text):
    """Sends a line; returns (answer, stats match) once the next prompt is shown."""
    child.sendline(text)
    child.expect_exact(text + "\r\n")  # the terminal's echo
    child.expect(STATS)
    stats = child.match
    # The answer, its newline and the notice of an answer cut at --max-new-tokens, on one terminal.
    answer = re.sub(r"\n(?:mhsa chat: answer cut[^\n]*\n)?\Z", "", child.before.replace("\r\n", "\n"))
    child.expect_exact("> ")
    return answer, stats


def messages_answer(d, messages, *args):
    r = subprocess.run([str(CLI), "chat", "-t", "1", "--model", str(d), "--messages", "-", "--json", *map(str, args)],
                       input=json.dumps(messages).encode(), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    j = json.loads(r.stdout)
    spec = j.pop("speculation")  # what speculative decoding did (test_speculative.py checks it)
    assert j.pop("seed") == 0  # greedy: no seed drawn
    assert set(spec) == {"forwards", "drafted", "accepted"} and 0 <= spec["accepted"] <= spec["drafted"]
    return j


def line(rng):
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))).strip() or "hi"


def test_two_turns_reuse_the_cache_and_equal_a_fresh_answer(chat_dir, rng):
    n = rng.randint(5, 25)
    child = spawn("--model", chat_dir, "-n", n, "--verbose", "--system", "Be brief.")
    u1, u2 = line(rng), line(rng)
    a1, s1 = turn(child, u1)
    a2, s2 = turn(child, u2)
    p1, e1, r1, g1, f1 = s1.groups()
    p2, e2, r2, g2, f2 = s2.groups()
    assert (r1, e1, g1, f1) == ("0", p1, str(n), "length")
    assert int(r2) >= int(p1), "the first turn's prompt was evaluated again"
    assert int(e2) == int(p2) - int(r2)
    assert (g2, f2) == (str(n), "length")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    # The same conversation from an empty cache, in the --messages form.
    system = {"role": "system", "content": "Be brief."}
    j1 = messages_answer(chat_dir, [system, {"role": "user", "content": u1}], "-n", n)
    assert j1["content"] == a1 and j1["completion_tokens"] == n and j1["prompt_tokens"] == int(p1)
    j2 = messages_answer(chat_dir, {"messages": [system, {"role": "user", "content": u1},
                                                 {"role": "assistant", "content": a1},
                                                 {"role": "user", "content": u2}]}, "-n", n)
    assert j2 == {"role": "assistant", "content": a2, "finish_reason": "length", "prompt_tokens": int(p2),
                  "completion_tokens": n, "cached_tokens": 0}


def interrupt(child):
    """Ctrl-C once the answer has started: the answer stops and the prompt comes back."""
    child.expect(r"[\s\S]{30}")
    child.sendintr()
    child.expect_exact("mhsa chat: answer stopped")
    child.expect(STATS)
    stats = [int(x) for x in child.match.groups()[:4]]
    assert child.match.group(5) == "cancelled" and 0 < stats[3] < 60000
    child.expect_exact("> ")
    return stats  # prompt, evaluated, reused, generated


def test_ctrl_c_stops_the_answer_not_the_program(chat_dir):
    child = spawn("--model", chat_dir, "-n", 1000000, "--verbose")
    child.sendline("tell me a story")
    child.expect_exact("tell me a story\r\n")
    prompt, _, _, _ = interrupt(child)
    # The next turn works; the stopped answer stayed in the conversation, the first prompt in the cache.
    child.sendline("the end")
    child.expect_exact("the end\r\n")
    prompt2, _, reused, _ = interrupt(child)
    assert reused >= prompt and prompt2 > prompt + 5
    # Ctrl-C at the prompt discards the line typed so far: "partial/exit" would be sent as a message.
    child.send("partial")
    child.sendintr()
    child.expect_exact("> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF, timeout=10)
    child.close()
    assert child.exitstatus == 0


def test_reset_and_ctrl_d(chat_dir, rng):
    child = spawn("--model", chat_dir, "-n", 4, "--verbose")
    u = line(rng)
    a1, s1 = turn(child, u)
    turn(child, line(rng))
    child.sendline("/reset")
    child.expect_exact("conversation cleared")
    child.expect_exact("> ")
    a3, s3 = turn(child, u)
    assert s3.group(3) == "0" and s3.group(1) == s1.group(1) and a3 == a1  # a fresh start
    child.sendline("/bogus")
    child.expect_exact("unknown command '/bogus': expected /help, /reset or /exit")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF, timeout=10)
    child.close()
    assert child.exitstatus == 0


def test_full_context_is_a_notice_not_a_crash(chat_dir, tmp_path):
    d = variant(chat_dir, tmp_path / "short", context=40)
    child = spawn("--model", d, "-n", 1000, "--verbose")
    _, stats = turn(child, "Hello")
    assert stats.group(5) == "context_full"
    child.sendline("Hello again")
    child.expect_exact("fills the model's context (40 tokens) and the message was not sent; /reset to start a new one")
    child.expect_exact("> ")
    child.sendline("/reset")
    child.expect_exact("> ")
    _, stats = turn(child, "Hi")
    assert stats.group(3) == "0"
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    r = subprocess.run([str(CLI), "chat", "--model", d, "--messages", "-"], capture_output=True,
                       input=json.dumps([{"role": "user", "content": " the lazy dog" * 20}]).encode())
    assert r.returncode == 2
    assert "mhsa: error: --messages: expected a conversation of fewer than 40 tokens" in r.stderr.decode()


def test_messages_form(chat_dir, tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps([{"role": "user", "content": "Hello"}]))
    r = subprocess.run([str(CLI), "chat", "--model", str(chat_dir), "--messages", str(f), "-n", "7"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    j = messages_answer(chat_dir, [{"role": "user", "content": "Hello"}], "-n", 7)
    assert r.stdout.decode() == j["content"] + "\n"
    # --chat-template: a template from a file replaces the model's (here: the same, so the same answer).
    bare = variant(chat_dir, tmp_path / "bare", template=False)
    (tmp_path / "t.jinja").write_text(CHATML)
    assert messages_answer(bare, [{"role": "user", "content": "Hello"}], "-n", 7,
                           "--chat-template", tmp_path / "t.jinja") == j


def test_default_model_with_a_template(tmp_path):
    """The embedded default model (byte-level, no special tokens, no template) chats with a given
    template; the text it continues is the rendered conversation (it crashed once: no eos token)."""
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    r = subprocess.run([str(CLI), "chat", "-t", "1", "--chat-template", str(tmp_path / "t.jinja"), "--messages", "-",
                        "--json", "-n", "12"], input=b'[{"role": "user", "content": "And God said"}]',
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    j = json.loads(r.stdout)
    assert j["prompt_tokens"] == len("And God said\n") and j["completion_tokens"] == 12
    g = subprocess.run([str(CLI), "generate", "-t", "1", "--prompt", "And God said\n", "-n", "12"],
                       capture_output=True, timeout=120)
    assert g.returncode == 0, g.stderr.decode()
    assert g.stdout.decode() == j["content"] + "\n"  # generate prints the continuation


@pytest.mark.parametrize("content, message", [
    (b'"hi"', "messages: expected an array of {\"role\", \"content\"} objects, got a string"),
    (b'{"msgs": []}', "messages: expected an array of messages or an object with \"messages\""),
    (b"[]", "messages: expected at least one message"),
    (b'[{"role": "user"}]', "messages[0]: expected an object with \"content\""),
    (b'[{"content": "x"}]', "messages[0]: expected an object with \"role\""),
    (b'[{"role": "user", "content": ["x"]}]', "messages[0].content: expected a string, got an array"),
    (b'[{"role": "user", "content": "\xff"}]', "messages: expected UTF-8 text, got an invalid byte at offset 30"),
    (b"[" * 200, "messages: expected JSON"),
    (b'[{"role": "user", "content": "x"}', "messages: expected JSON"),
])
def test_messages_errors(chat_dir, tmp_path, content, message):
    f = tmp_path / "m.json"
    f.write_bytes(content)
    r = subprocess.run([str(CLI), "chat", "--model", chat_dir, "--messages", f], capture_output=True, timeout=60)
    assert r.returncode == 2 and r.stdout == b""
    assert f"mhsa: error: {message}" in r.stderr.decode(), r.stderr.decode()


def test_usage_errors(chat_dir, tmp_path):
    def fails(*args, stdin=None):
        r = subprocess.run([str(CLI), "chat", *map(str, args)], capture_output=True, timeout=60, input=stdin)
        assert r.returncode == 2 and r.stdout == b""
        return r.stderr.decode()

    big = tmp_path / "big.json"
    big.write_bytes(b" " * (17 << 20))
    assert "--messages: expected a file of at most 16 MiB, got 17825792 bytes" in fails("--model", chat_dir, "--messages", big)
    assert "--messages: expected at most 16 MiB on standard input" in fails("--model", chat_dir, "--messages", "-",
                                                                           stdin=b" " * (17 << 20))
    bare = variant(chat_dir, tmp_path / "bare", template=False)
    err = fails("--model", bare, "--messages", "-", stdin=b'[{"role": "user", "content": "x"}]')
    assert "expected a chat template (chat_template in '" in err and "tokenizer_config.json" in err
    assert "give one with --chat-template FILE" in err
    assert "--json: expected --prompt TEXT or --messages FILE with it" in fails("--model", chat_dir, "--json")
    assert "--system: expected no system message in --messages" in fails(
        "--model", chat_dir, "--system", "s", "--messages", "-", stdin=b'[{"role": "system", "content": "x"}]')
    assert "--chat-template: expected a readable file" in fails("--model", chat_dir, "--chat-template",
                                                                tmp_path / "absent.jinja")


def test_answer_equals_transformers(chat_dir, rng):
    """The whole chain against transformers on the same directory: apply_chat_template's ids, greedy
    generate's tokens, and their decoded text."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    # The saved tokenizer.json as it is (transformers 5's AutoTokenizer may rebuild a family's own
    # pre-tokenizer for a llama/qwen2 directory instead).
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(chat_dir))
    model = transformers.LlamaForCausalLM.from_pretrained(str(chat_dir), torch_dtype=torch.float32).eval()
    n = rng.randint(5, 30)
    messages = [{"role": "system", "content": line(rng)}, {"role": "user", "content": line(rng)},
                {"role": "assistant", "content": line(rng)}, {"role": "user", "content": line(rng)}]
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones((1, len(ids)), dtype=torch.long))
    j = messages_answer(chat_dir, messages, "-n", n)
    assert j["prompt_tokens"] == len(ids) and j["completion_tokens"] == n
    assert j["content"] == hf.decode(out[0, len(ids):], skip_special_tokens=True)


def test_a_given_template_sees_every_special_token_of_the_config(chat_dir, tmp_path, rng):
    transformers = pytest.importorskip("transformers")
    template = tmp_path / "t.jinja"
    source = "{{ pad_token }}" + CHATML  # pad_token: only in tokenizer_config.json
    template.write_text(source)
    messages = [{"role": "user", "content": line(rng)}]
    out = messages_answer(chat_dir, messages, "--chat-template", template, "-n", "1")
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(chat_dir))
    ids = hf.apply_chat_template(messages, chat_template=source, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # newer transformers give a BatchEncoding
        ids = ids["input_ids"]
    assert ids[0] == hf.convert_tokens_to_ids("<|endoftext|>")
    assert out["prompt_tokens"] == len(ids)
