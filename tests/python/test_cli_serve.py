"""`mhsa serve` end to end: the server started as a user starts it (`--port 0`, the URL read from its
first line), driven by the official `openai` client — completions, chat completions, streaming, stop
strings, seeds, usage — with `mhsa generate` and `mhsa chat --messages` as the oracles (greedy, and
sampled with a seed); concurrent requests get what they get alone; hostile HTTP (bad JSON, wrong
types, huge numbers, a 10 MB body, a request cut off, a wrong API key, a full queue, a client that
leaves mid-stream) gets the documented status and the server keeps serving, as do 500 randomly
mutated requests; the paged KV pool: allocated at
startup or as it fills (--kv-alloc), a full pool queues, a request larger than it is refused, the blocks come back, a shared prompt prefix
is prefilled once and gives generate's text, with --preempt requests that need more than the pool
are preempted and resume with the text they get alone; SIGTERM exits 0; log-probabilities (completions' and
chat's shapes): each token's is the log-softmax of mhsa.Model's own logits at its place, top lists
sorted and counted, text offsets, streamed as whole, batched as alone, bad values 400."""

import http.client
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import write_gpt2_dir  # noqa: E402
from tiny_chat_model import WORDS, write_chat_dir  # noqa: E402
from serve_process import Server  # noqa: E402


@pytest.fixture(scope="module")
def seed():
    return int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))


@pytest.fixture
def rng(request, seed):
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return write_gpt2_dir(tmp_path_factory.mktemp("gpt2-serve"), seed=4321)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, seed):
    d = tmp_path_factory.mktemp("qwen-serve")

    def edit(model, tok):  # answers that do not end at once
        model.lm_head.weight[tok.token_to_id("<|im_end|>")] = 0

    write_chat_dir(d, tokens=307, padding=0, max_positions=32768, seed=seed, edit=edit)
    return d


@pytest.fixture(scope="module")
def gpt2(gpt2_dir):
    s = Server(gpt2_dir, "--parallel", 3)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def chat(chat_dir):
    s = Server(chat_dir, "--parallel", 2, "--ctx-size", 2048)
    yield s
    assert s.stop() == 0


def generate(d, prompt, n, *args):
    r = subprocess.run([str(CLI), "generate", "-t", "1", "--model", str(d), "--prompt", prompt, "-n", str(n), "--json",
                        *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def chat_answer(d, messages, *args):
    r = subprocess.run([str(CLI), "chat", "-t", "1", "--model", str(d), "--messages", "-", "--json", *map(str, args)],
                       input=json.dumps(messages), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def words(rng, k):
    return "".join(rng.choice(WORDS) for _ in range(k)).strip() or "Hello"


# ---- the openai client --------------------------------------------------------------------------

def test_penalties_and_logit_bias_equal_generate(gpt2, gpt2_dir, rng):
    """presence_penalty, frequency_penalty and logit_bias as OpenAI defines them, computed as
    `mhsa generate --presence-penalty --frequency-penalty --logit-bias ID=BIAS` computes them (the
    formula itself: test_gpt2.cpp's sampler test); +100 forces a token, -100 bans one."""
    c = gpt2.client()
    prompt = words(rng, rng.randint(2, 6))
    plain = generate(gpt2_dir, prompt, 12, "--ignore-eos")["tokens"]
    forced = int(rng.randint(0, 50000))
    r = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=5, temperature=0,
                             logit_bias={str(forced): 100})
    ref = generate(gpt2_dir, prompt, 5, "--logit-bias", f"{forced}=100")
    assert ref["tokens"] == [forced] * 5 and r.choices[0].text == ref["text"]
    r = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=12, temperature=0,
                             logit_bias={str(plain[0]): -100})
    ref = generate(gpt2_dir, prompt, 12, "--logit-bias", f"{plain[0]}=-100")
    assert ref["tokens"][0] != plain[0] and r.choices[0].text == ref["text"]
    for pres, freq in [(0.5, 1.5), (-2, 2), (2, -1)]:
        seed = int(rng.randint(0, 2**31))
        for temperature in (0, 0.8):
            r = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=20, temperature=temperature, seed=seed,
                                     presence_penalty=pres, frequency_penalty=freq)
            ref = generate(gpt2_dir, prompt, 20, "--presence-penalty", pres, "--frequency-penalty", freq,
                           "--temperature", temperature, "--seed", seed)
            assert r.choices[0].text == ref["text"], (pres, freq, temperature)
    u = gpt2.url + "/v1/completions"
    for value in [[], "x", {"abc": 1}, {"-1": 1}, {"+5": 1}, {"5 ": 1}, {"": 1}, {"50257": 1}, {"99999999999999999999": 1},
                  {"5": 101}, {"5": -100.5}, {"5": "1"}, {"5": None}]:
        assert_error(post(u, {"prompt": "Hello", "logit_bias": value}), 400, param="logit_bias")
    for field in ("presence_penalty", "frequency_penalty"):
        assert_error(post(u, {"prompt": "Hello", field: 2.5}), 400, param=field)
        assert_error(post(u, {"prompt": "Hello", field: "1"}), 400, param=field)
    healthy(gpt2)


def test_completion_greedy_equals_generate(gpt2, gpt2_dir, rng):
    prompt, n = words(rng, rng.randint(1, 7)), rng.randint(5, 30)
    ref = generate(gpt2_dir, prompt, n)
    r = gpt2.client().completions.create(model=gpt2.id, prompt=prompt, max_tokens=n, temperature=0)
    assert r.object == "text_completion" and r.model == gpt2.id and len(r.choices) == 1
    assert r.choices[0].text == ref["text"]
    assert r.choices[0].finish_reason == ("length" if len(ref["tokens"]) == n else "stop")
    assert r.usage.prompt_tokens == ref["prompt_tokens"]
    assert r.usage.completion_tokens == len(ref["tokens"])
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ids = gpt2.client().completions.create(model=gpt2.id, prompt=ref["prompt_ids"], max_tokens=n, temperature=0)
    assert ids.choices[0].text == ref["text"]  # a prompt of token ids


def test_streamed_completion_equals_whole(gpt2, rng):
    prompt, n = words(rng, 4), rng.randint(10, 40)
    c = gpt2.client()
    whole = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=n, temperature=0)
    chunks = list(c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=n, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_strings(gpt2, gpt2_dir, rng):
    prompt = words(rng, 3)
    full = gpt2.client().completions.create(model=gpt2.id, prompt=prompt, max_tokens=40, temperature=0).choices[0].text
    assert len(full) > 15
    # Not across a U+FFFD if possible: mhsa generate matches stop strings in the raw bytes.
    clean = [i for i in range(5, len(full) - 3) if "\ufffd" not in full[i:i + 3]]
    at = rng.choice(clean or range(5, len(full) - 3))
    stop = full[at:at + 3]
    expected = full[:full.find(stop)]
    for stops in (stop, ["never seen \u2603", stop]):
        r = gpt2.client().completions.create(model=gpt2.id, prompt=prompt, max_tokens=40, temperature=0, stop=stops)
        assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
        streamed = gpt2.client().completions.create(model=gpt2.id, prompt=prompt, max_tokens=40, temperature=0,
                                                    stop=stops, stream=True)
        assert "".join(ch.choices[0].text for ch in streamed) == expected
    if "\ufffd" not in stop:
        assert generate(gpt2_dir, prompt, 40, "--stop", stop)["text"] == expected


def test_seeds(gpt2, gpt2_dir, chat, rng):
    prompt, s = words(rng, 3), rng.randrange(2**32)
    c = gpt2.client()
    ask = lambda seed: c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=12, temperature=1.0,  # noqa: E731
                                            top_p=0.95, seed=seed).choices[0].text
    a = ask(s)
    assert ask(s) == a
    assert generate(gpt2_dir, prompt, 12, "--temperature", 1.0, "--top-p", 0.95, "--seed", s)["text"] == a
    # Other seeds, other texts (on the chat model: this GPT-2's scaled, tied embeddings make it too sure)
    sample = lambda seed: chat.client().completions.create(model=chat.id, prompt=prompt, max_tokens=12,  # noqa: E731
                                                           temperature=1.0, seed=seed).choices[0].text
    b = sample(s)
    assert sample(s) == b
    assert len({sample(s + k) for k in range(1, 4)} | {b}) > 1


def test_concurrent_greedy_requests_get_what_they_get_alone(gpt2, rng):
    c = gpt2.client()
    jobs = [(words(rng, rng.randint(1, 8)), rng.randint(1, 40)) for _ in range(8)]
    alone = [c.completions.create(model=gpt2.id, prompt=p, max_tokens=n, temperature=0).choices[0].text for p, n in jobs]

    def ask(job):
        p, n = job
        if n % 2:
            return "".join(ch.choices[0].text for ch in c.completions.create(
                model=gpt2.id, prompt=p, max_tokens=n, temperature=0, stream=True))
        return c.completions.create(model=gpt2.id, prompt=p, max_tokens=n, temperature=0).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, jobs))
    assert together == alone


def test_chat_completion_equals_mhsa_chat(chat, chat_dir, rng):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": words(rng, 5)}]
    n = rng.randint(3, 25)
    ref = chat_answer(chat_dir, messages, "-n", n)
    c = chat.client()
    r = c.chat.completions.create(model=chat.id, messages=messages, max_tokens=n, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref["content"]
    assert r.choices[0].finish_reason == ref["finish_reason"]
    assert r.usage.prompt_tokens == ref["prompt_tokens"] and r.usage.completion_tokens == ref["completion_tokens"]
    chunks = list(c.chat.completions.create(model=chat.id, messages=messages, max_tokens=n, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ref["content"]
    assert chunks[-1].choices[0].finish_reason == ref["finish_reason"]
    # max_completion_tokens (the newer name), content as text parts, a seed
    parts = [messages[0], {"role": "user", "content": [{"type": "text", "text": messages[1]["content"]}]}]
    r2 = c.chat.completions.create(model=chat.id, messages=parts, max_completion_tokens=n, temperature=0)
    assert r2.choices[0].message.content == ref["content"]
    s = rng.randrange(2**32)
    sampled = chat_answer(chat_dir, messages, "-n", n, "--temperature", 0.8, "--seed", s)
    r3 = c.chat.completions.create(model=chat.id, messages=messages, max_tokens=n, temperature=0.8, seed=s)
    assert r3.choices[0].message.content == sampled["content"]


def test_models_health_metrics(gpt2):
    models = gpt2.client().models.list()
    assert [m.id for m in models.data] == [gpt2.id, "default"]  # the served id first, then its aliases
    with urllib.request.urlopen(gpt2.url + "/health") as r:
        assert json.load(r) == {"status": "ok"}
    gpt2.client().completions.create(model=gpt2.id, prompt="Hello", max_tokens=3, temperature=0)
    with urllib.request.urlopen(gpt2.url + "/metrics") as r:
        text = r.read().decode()
    for name in ("mhsa_requests_total{", "mhsa_generated_tokens_total", "mhsa_queue_length", "mhsa_batch_size",
                 "mhsa_request_duration_seconds_sum", "mhsa_time_to_first_token_seconds_count",
                 "mhsa_scheduler_rows_total", "mhsa_scheduler_sequences_total", "mhsa_step_rows",
                 "mhsa_step_sequences"):
        assert name in text
    steps = int(re.search(r"^mhsa_scheduler_steps_total (\d+)$", text, re.M).group(1))
    seqs = int(re.search(r"^mhsa_scheduler_sequences_total (\d+)$", text, re.M).group(1))
    rows = int(re.search(r"^mhsa_scheduler_rows_total (\d+)$", text, re.M).group(1))
    assert 1 <= steps <= seqs <= rows
    assert int(re.search(r'mhsa_requests_total\{path="/v1/completions",status="200"\} (\d+)', text).group(1)) >= 1


# ---- log-probabilities ----------------------------------------------------------------------------

def token_text(b):
    """A token's text as OpenAI writes it: its bytes, or "bytes:\\xNN..." when not valid UTF-8."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{c:02x}" for c in b)


@pytest.fixture(scope="module")
def oracle(gpt2_dir, chat_dir):
    """For each model: mhsa.Model, and the token id of each token text (bytes for chat)."""
    mhsa = pytest.importorskip("mhsa")
    out = {}
    for d in (gpt2_dir, chat_dir):
        tok = mhsa.Tokenizer.load(d)
        out[d] = mhsa.Model.load(d), tok, {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    return out


def model_logprobs(model, prompt, tokens):
    """log-softmax (float64) of mhsa's own logits at each token's place: [len(tokens), V]."""
    ids = np.array(list(prompt) + list(tokens[:-1]), dtype=np.int32)
    logits = model.forward(ids).astype(np.float64)[len(prompt) - 1:]
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def check_top(ref, got_ids, got_values, k):
    """The top list: k distinct tokens, most likely first, each the model's rank-th (up to rounding)."""
    assert len(got_ids) == len(set(got_ids)) == k
    assert list(got_values) == sorted(got_values, reverse=True)
    ranked = np.sort(ref)[::-1][:k]
    assert np.allclose(got_values, ref[got_ids], atol=1e-4, rtol=0)
    assert np.allclose(got_values, ranked, atol=1e-4, rtol=0)


def test_completion_logprobs_are_the_models(gpt2, gpt2_dir, oracle, rng):
    model, tok, id_of = oracle[gpt2_dir]
    by_text = {token_text(b): i for b, i in id_of.items()}
    prompt = [rng.randrange(50256) for _ in range(rng.randint(1, 12))]
    n, k = rng.randint(3, 14), rng.randint(0, 5)
    c = gpt2.client()
    r = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=n, temperature=0, logprobs=k)
    text, lp = r.choices[0].text, r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == \
        r.usage.completion_tokens
    gen = [by_text[t] for t in lp.tokens]
    ref = model_logprobs(model, prompt, gen)
    for i, t in enumerate(gen):
        assert abs(ref[i, t] - ref[i].max()) <= 1e-4  # greedy: the most likely
        assert abs(lp.token_logprobs[i] - ref[i, t]) <= 1e-4
        top = lp.top_logprobs[i]
        check_top(ref[i], [by_text[x] for x in top], list(top.values()), k)
        assert k == 0 or next(iter(top)) == lp.tokens[i]
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for t, off in zip(lp.tokens, lp.text_offset):
        assert t.startswith("bytes:") or text[off:].startswith(t)
    if not any(t.startswith("bytes:") for t in lp.tokens):
        assert "".join(lp.tokens) == text
    # Streamed: each chunk the log-probabilities of its tokens, together those of the whole.
    chunks = [ch.choices[0] for ch in c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=n, temperature=0,
                                                           logprobs=k, stream=True)]
    assert "".join(ch.text for ch in chunks) == text
    assert all(ch.logprobs is not None for ch in chunks)
    for field in ("tokens", "text_offset"):
        assert [x for ch in chunks for x in getattr(ch.logprobs, field)] == getattr(lp, field)
    assert np.allclose([x for ch in chunks for x in ch.logprobs.token_logprobs], lp.token_logprobs, atol=1e-4, rtol=0)
    streamed_top = [x for ch in chunks for x in ch.logprobs.top_logprobs]
    for a, b in zip(streamed_top, lp.top_logprobs, strict=True):
        assert np.allclose(list(a.values()), list(b.values()), atol=1e-4, rtol=0)
    # Not asked for: none.
    assert c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=2, temperature=0).choices[0].logprobs is None


def test_sampled_and_stopped_completion_logprobs(gpt2, gpt2_dir, oracle, rng):
    model, tok, id_of = oracle[gpt2_dir]
    by_text = {token_text(b): i for b, i in id_of.items()}
    prompt, c = words(rng, 3), gpt2.client()
    ids = tok.encode(prompt)
    # Sampled (temperature, top_p): still the model's distribution, before either.
    r = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=6, temperature=1.5, top_p=0.9,
                             seed=rng.randrange(2**32), logprobs=2)
    lp = r.choices[0].logprobs
    assert r.usage.prompt_tokens == len(ids)
    gen = [by_text[t] for t in lp.tokens]
    ref = model_logprobs(model, ids, gen)
    assert np.allclose(lp.token_logprobs, ref[np.arange(len(gen)), gen], atol=1e-4, rtol=0)
    # A stop string: the tokens whose text begins before it.
    full = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=30, temperature=0, logprobs=0).choices[0]
    clean = [i for i in range(3, len(full.text) - 2) if "\ufffd" not in full.text[i:i + 2]]
    stop = full.text[rng.choice(clean or [len(full.text) // 2]):][:2] or "."
    r = c.completions.create(model=gpt2.id, prompt=prompt, max_tokens=30, temperature=0, logprobs=0, stop=stop).choices[0]
    cut = len(r.text)
    kept = [i for i, off in enumerate(full.logprobs.text_offset) if off < cut]
    assert r.logprobs.tokens == [full.logprobs.tokens[i] for i in kept]
    assert r.logprobs.text_offset == [full.logprobs.text_offset[i] for i in kept]


def test_chat_logprobs_are_the_models(chat, chat_dir, oracle, rng):
    model, tok, id_of = oracle[chat_dir]
    messages = [{"role": "user", "content": words(rng, 4)}]
    n, k = rng.randint(3, 12), rng.randint(0, 20)
    c = chat.client()
    r = c.chat.completions.create(model=chat.id, messages=messages, max_tokens=n, temperature=0, logprobs=True,
                                  top_logprobs=k)
    content = r.choices[0].logprobs.content
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert len(prompt) == r.usage.prompt_tokens and len(content) == r.usage.completion_tokens
    gen = [id_of[bytes(e.bytes)] for e in content]
    ref = model_logprobs(model, prompt, gen)
    for i, (e, t) in enumerate(zip(content, gen)):
        assert e.token == token_text(bytes(e.bytes))
        assert abs(e.logprob - ref[i, t]) <= 1e-4 and abs(ref[i, t] - ref[i].max()) <= 1e-4
        check_top(ref[i], [id_of[bytes(x.bytes)] for x in e.top_logprobs], [x.logprob for x in e.top_logprobs], k)
        assert all(x.token == token_text(bytes(x.bytes)) for x in e.top_logprobs)
        assert k == 0 or (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
    if not any(tok.is_special(t) or e.token.startswith("bytes:") for e, t in zip(content, gen)):
        assert "".join(e.token for e in content) == r.choices[0].message.content
    chunks = [ch.choices[0] for ch in c.chat.completions.create(model=chat.id, messages=messages, max_tokens=n,
                                                                temperature=0, logprobs=True, top_logprobs=k,
                                                                stream=True)]
    streamed = [e for ch in chunks for e in ch.logprobs.content]
    # Equal up to float32 rounding: the second request shares the first's cached prompt blocks.
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    assert np.allclose([e.logprob for e in streamed], [e.logprob for e in content], atol=1e-4, rtol=0)
    for a, b in zip(streamed, content):
        assert np.allclose([x.logprob for x in a.top_logprobs], [x.logprob for x in b.top_logprobs], atol=1e-4, rtol=0)
    plain = c.chat.completions.create(model=chat.id, messages=messages, max_tokens=2, temperature=0, logprobs=False)
    assert plain.choices[0].logprobs is None


def test_logprobs_batched_equal_alone(gpt2, rng):
    c = gpt2.client()
    jobs = [(words(rng, rng.randint(1, 6)), rng.randint(2, 12), rng.randint(0, 5)) for _ in range(5)]

    def ask(job):
        p, n, k = job
        return c.completions.create(model=gpt2.id, prompt=p, max_tokens=n, temperature=0, logprobs=k).choices[0].logprobs

    alone = [ask(j) for j in jobs]
    with ThreadPoolExecutor(5) as pool:
        together = list(pool.map(ask, jobs))
    for a, b in zip(alone, together):
        assert a.tokens == b.tokens and a.text_offset == b.text_offset
        assert np.allclose(a.token_logprobs, b.token_logprobs, atol=1e-4, rtol=0)
        for x, y in zip(a.top_logprobs, b.top_logprobs):
            assert np.allclose(list(x.values()), list(y.values()), atol=1e-4, rtol=0)


# ---- errors --------------------------------------------------------------------------------------

def post(url, body, headers=None):
    """(status, parsed JSON body) of a raw POST; body bytes or a JSON-able value."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def assert_error(status_body, status, param=None, code=None):
    got, body = status_body
    assert got == status, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if param is not None:
        assert e["param"] == param or e["param"].startswith(param + "["), e
    if code is not None:
        assert e["code"] == code, e


def healthy(s):
    r = s.client().completions.create(model=s.id, prompt="Hello", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens <= 2


def test_client_mistakes_are_400_not_500(gpt2):
    u = gpt2.url + "/v1/completions"
    assert_error(post(u, b'{"prompt": "Hello", '), 400, code="invalid_json")
    assert_error(post(u, b"\xff\xfe not json"), 400)
    assert_error(post(u, [1, 2]), 400, param="body")
    for field, value in [("temperature", "hot"), ("temperature", 2.5), ("top_p", 0), ("max_tokens", -1),
                         ("max_tokens", 1.5), ("max_tokens", "10"), ("stream", "yes"), ("seed", "x"),
                         ("stop", 7), ("stop", ["a", "b", "c", "d", "e"]), ("prompt", 5), ("prompt", [1, -2]),
                         ("prompt", [10**12]), ("n", 2), ("logprobs", 6), ("logprobs", -1), ("logprobs", True),
                         ("logprobs", "2"), ("logprobs", 1.5), ("top_logprobs", 2), ("echo", "yes"),
                         ("presence_penalty", 3)]:
        assert_error(post(u, {"prompt": "Hello", field: value}), 400, param=field)
    assert_error(post(u, {"prompt": "Hello", "max_tokens": 10**30}), 400, param="max_tokens")
    assert_error(post(u, {"prompt": "Hello", "max_tokens": 10**6}), 400, code="context_length_exceeded")
    assert_error(post(u, {"prompt": " fox" * 200}), 400, code="context_length_exceeded")
    assert post(u, {"prompt": "Hello", "max_tokens": 1, "model": "gpt-4"})[0] == 200  # any name: the served model
    assert_error(post(u, {}), 400, param="prompt")
    assert_error(post(gpt2.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}), 400,
                 code="no_chat_template")
    assert_error(post(gpt2.url + "/v1/nothing", {}), 404)
    assert_error(post(u, {"prompt": "Hello", "unknown_field": {"x": [1]}}), 400, param="unknown_field",
                 code="unknown_parameter")  # never silently ignored
    ok = post(u, {"prompt": "Hello", "max_tokens": 2, "temperature": 0, "user": "me"})
    assert ok[0] == 200 and ok[1]["usage"]["completion_tokens"] == 2  # fields without effect are accepted
    with pytest.raises(openai.BadRequestError):
        gpt2.client().completions.create(model=gpt2.id, prompt="Hello", n=2)
    healthy(gpt2)


def test_chat_mistakes(chat):
    u = chat.url + "/v1/chat/completions"
    for messages, param in [("hi", "messages"), ([], "messages"), ([{"content": "x"}], "messages[0].role"),
                            ([{"role": "user", "content": 5}], "messages[0].content"),
                            ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type")]:
        assert_error(post(u, {"messages": messages}), 400, param=param)
    assert_error(post(u, {"messages": [{"role": "user", "content": "hi " * 3000}]}), 400, code="context_length_exceeded")
    hi = [{"role": "user", "content": "hi"}]
    for extra, param in [({"logprobs": "yes"}, "logprobs"), ({"logprobs": 3}, "logprobs"),
                         ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                         ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
                         ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
                         ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": False, "top_logprobs": 3}, "top_logprobs")]:
        assert_error(post(u, {"messages": hi, **extra}), 400, param=param)
    healthy(chat)


def raw(port, data, shutdown=True):
    """Sends bytes on a fresh connection and returns what comes back ('' when closed without reply)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if shutdown:
            s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out.decode("latin-1")


def test_hostile_http(gpt2):
    # A 10 MB body: 413.
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {10 << 20}\r\n\r\n").encode()
    reply = raw(gpt2.port, head + b"{" * (10 << 20), shutdown=False)
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert '"error"' in reply
    # Cut short after its headers: no answer, the server goes on.
    raw(gpt2.port, head + b"{" * 1000)  # (the server waits for the rest until its read timeout, 2 s)
    # A request cut off half-way, then closed; garbage; an absurd header.
    raw(gpt2.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
    raw(gpt2.port, b"\x00\x01\x02 garbage \r\n\r\n")
    assert raw(gpt2.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
               shutdown=False).startswith("HTTP/1.1 200")
    healthy(gpt2)


# ---- echo: the prompt's log-probabilities (lm-evaluation-harness's loglikelihood requests) ----------


def test_echo_gives_the_prompts_logprobs_in_openais_shape(gpt2, gpt2_dir, oracle):
    model, tok, _ = oracle[gpt2_dir]
    prompt = "The quick brown fox jumps over"
    ids = tok.encode(prompt)
    want = model.token_logprobs(np.array(ids))
    logits = model.forward(np.array(ids)).astype(np.float64)
    client = gpt2.client()
    r = client.completions.create(model=gpt2.id, prompt=prompt, echo=True, logprobs=2, max_tokens=0)
    c = r.choices[0]
    assert c.text == prompt and r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
    assert "".join(lp.tokens) == prompt and lp.text_offset[0] == 0
    assert lp.text_offset == [len(tok.decode(ids[:i])) for i in range(len(ids))]
    np.testing.assert_allclose(lp.token_logprobs[1:], want[1:], rtol=0, atol=1e-5)  # the CLI blocks GPT-2's head
    for i in range(1, len(ids)):  # the log-softmax of the logits before it, in float64
        row = logits[i - 1] - logits[i - 1].max()
        assert abs(lp.token_logprobs[i] - (row[ids[i]] - np.log(np.exp(row).sum()))) < 1e-4
        top = list(lp.top_logprobs[i].values())
        assert len(top) == 2 and top[0] >= top[1] and abs(top[0] - (row.max() - np.log(np.exp(row).sum()))) < 1e-4
    # max_tokens 1, as lm-eval asks: the prompt's entries, then one for the generated token, end or not.
    for max_tokens in (1, 3):
        r = client.completions.create(model=gpt2.id, prompt=ids, echo=True, logprobs=1, max_tokens=max_tokens,
                                      temperature=0)
        c = r.choices[0]
        n = r.usage.completion_tokens
        assert 1 <= n <= max_tokens and c.text.startswith(prompt)
        assert len(c.logprobs.token_logprobs) == len(ids) + n
        np.testing.assert_allclose(c.logprobs.token_logprobs[1:len(ids)], want[1:], rtol=0, atol=1e-5)
        assert c.logprobs.text_offset[len(ids)] == len(prompt)
    # streamed: the prompt's chunk first, then the generated text
    chunks = list(client.completions.create(model=gpt2.id, prompt=prompt, echo=True, logprobs=0, max_tokens=2,
                                            temperature=0, stream=True))
    assert chunks[0].choices[0].text == prompt and chunks[0].choices[0].logprobs.token_logprobs[0] is None
    assert len(chunks[0].choices[0].logprobs.tokens) == len(ids)
    # without logprobs: the text only
    r = client.completions.create(model=gpt2.id, prompt=prompt, echo=True, max_tokens=0)
    assert r.choices[0].text == prompt and r.choices[0].logprobs is None
    healthy(gpt2)


# ---- fuzzing the API: random mutations of valid requests ------------------------------------------

HOSTILE_VALUES = [None, True, False, 0, -1, 1, 3, 2**31, 2**63 - 1, 2**64, -2**63, 10**30, 1e308, -0.0, 0.5, 2.5,
                  float("nan"), float("inf"), "", "x", "10", "\ud800", "é" * 300, "<|endoftext|>", [], [1], [-5],
                  [10**12], ["a"] * 5, [[]], [None], {}, {"a": 1}, {"include_usage": "yes"}, [[[[[[[]]]]]]]]
COMPLETION_FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options",
                     "logprobs", "n", "echo", "suffix", "best_of", "model", "presence_penalty", "frequency_penalty",
                     "logit_bias", "user", "top_logprobs", "unknown"]
CHAT_FIELDS = ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "stream",
               "stream_options", "logprobs", "top_logprobs", "n", "model", "logit_bias", "tools", "unknown"]


def mutated_body(rng, base, fields):
    """A valid body with one to three mutations: a field set to a hostile value, removed or nested
    wrongly, a message's parts mistyped; then, sometimes, the JSON text itself cut, flipped, given a
    duplicate key or invalid UTF-8."""
    body = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.55:
            body[rng.choice(fields)] = rng.choice(HOSTILE_VALUES)
        elif kind < 0.7 and body:
            body.pop(rng.choice(list(body)))
        elif kind < 0.85 and isinstance(body.get("messages"), list) and body["messages"]:
            m = rng.choice(body["messages"])
            if isinstance(m, dict):
                m[rng.choice(["role", "content", "name", "tool_calls"])] = rng.choice(
                    HOSTILE_VALUES + ["user", "assistant", "tool", "system", [{"type": "text", "text": "hi"}],
                                      [{"type": "text"}], [{"type": "text", "text": 5}]])
        else:
            body["max_tokens"] = rng.choice([0, 1, 2, 5, 16])
    text = json.dumps(body).encode()  # NaN and inf as JSON's invalid NaN / Infinity; "\ud800" escaped
    kind = rng.random()
    if kind < 0.08:
        text = text[:rng.randrange(len(text) + 1)]
    elif kind < 0.16:
        i = rng.randrange(len(text))
        text = text[:i] + bytes([rng.randrange(256)]) + text[i + 1:]
    elif kind < 0.22 and text.startswith(b"{") and len(text) > 2:
        text = b'{"max_tokens": -1, ' + text[1:]  # a duplicate key, first or last wins
    elif kind < 0.26:
        text = text.replace(b'"', b'"\xff', 1)
    return text


def fuzz_requests(server, path, base, fields, rng, n):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    statuses = {}
    for i in range(n):
        body = mutated_body(rng, base, fields)
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
        what = f"request {i}: {body[:300]!r} -> {r.status} {data[:300]!r}"
        assert r.status in (200, 400, 404, 413), what
        if r.status != 200:
            e = json.loads(data)["error"]
            assert set(e) == {"message", "type", "param", "code"} and e["message"], what
            continue
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
            assert events and events[-1] == "[DONE]", what
            chunks = [json.loads(e) for e in events[:-1]]
            assert all(c["choices"] or "usage" in c for c in chunks), what
        else:
            answer = json.loads(data)
            assert len(answer["choices"]) == 1 and answer["usage"]["completion_tokens"] >= 0, what
        if r.getheader("Connection", "").lower() == "close":
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.close()
    return statuses


def test_fuzzed_requests_get_documented_answers(gpt2, chat, rng):
    """Random mutations of valid requests (hostile values in every field, fields removed, messages
    mistyped, the JSON text cut, flipped, duplicated or made invalid UTF-8), 250 to each endpoint:
    every answer is 200 with a well-formed body or stream, or a documented error status with
    OpenAI's error body; no 500 is ever counted; the servers then answer as before."""
    completions = fuzz_requests(gpt2, "/v1/completions", {"prompt": "Hello world", "max_tokens": 4, "temperature": 0},
                                COMPLETION_FIELDS, rng, 250)
    base = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "max_tokens": 4}
    chats = fuzz_requests(chat, "/v1/chat/completions", base, CHAT_FIELDS, rng, 250)
    for s, statuses in [(gpt2, completions), (chat, chats)]:
        assert statuses.get(200, 0) >= 20 and statuses.get(400, 0) >= 100, statuses  # both sides were reached
        with urllib.request.urlopen(s.url + "/metrics") as r:
            assert 'status="500"' not in r.read().decode()
        healthy(s)


def test_api_key(gpt2_dir):
    s = Server(gpt2_dir, "--api-key", "s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").completions.create(model=s.id, prompt="Hello", max_tokens=2)
        assert_error(post(s.url + "/v1/completions", {"prompt": "Hello"}), 401, code="invalid_api_key")
        with urllib.request.urlopen(s.url + "/health") as r:  # open to probes
            assert r.status == 200
        r = s.client(api_key="s3cret").completions.create(model=s.id, prompt="Hello", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
    finally:
        assert s.stop() == 0


def metric(s, *names):
    """The named values of one /metrics scrape (one snapshot: gauges read together agree)."""
    with urllib.request.urlopen(s.url + "/metrics") as r:
        text = r.read().decode()
    values = [float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)) for name in names]
    return values[0] if len(values) == 1 else values


def test_preempt_admits_by_prompt_and_resumes_with_the_same_text(chat_dir, rng):
    """--preempt: four requests whose answers need about twice the pool arrive together; the
    latest are preempted and resumed, and each answer equals the one it gets alone (greedy and
    seeded). A round of this tiny model takes tens of milliseconds, so on a busy host the four may
    not overlap: up to five rounds, until one preempts."""
    s = Server(chat_dir, "--parallel", 4, "--kv-blocks", 12, "--preempt")  # 192 tokens
    try:
        c = s.client(timeout=120)
        for _ in range(5):
            reqs = [dict(model=s.id, prompt=words(rng, rng.randint(1, 4)), max_tokens=rng.randint(90, 100),
                         temperature=0 if i % 2 else 0.9, seed=rng.randint(0, 1 << 30)) for i in range(4)]
            start = threading.Barrier(len(reqs))

            def at_once(r):  # the four arrive within a few milliseconds of each other
                client = s.client(timeout=120)
                start.wait()
                return client.completions.create(**r)

            with ThreadPoolExecutor(4) as pool:
                together = list(pool.map(at_once, reqs))
            for r, got in zip(reqs, together):
                alone = c.completions.create(**r)
                assert got.choices[0].text == alone.choices[0].text
                # (usage.prompt_tokens_details.cached_tokens differs: alone, the prompt's blocks are cached)
                assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (alone.usage.prompt_tokens, alone.usage.completion_tokens)
            if metric(s, "mhsa_preemptions_total") > 0:
                break
        assert metric(s, "mhsa_preemptions_total") > 0 and metric(s, "mhsa_recomputed_tokens_total") > 0
        for _ in range(100):
            if metric(s, "mhsa_batch_size") == 0 and metric(s, "mhsa_kv_blocks_used") == 0:
                break
            time.sleep(0.05)
        assert metric(s, "mhsa_kv_blocks_used", "mhsa_kv_blocks_reserved", "mhsa_preempted_requests") == [0, 0, 0]
        # Still refused at once: a request the whole pool could not hold.
        assert_error(post(s.url + "/v1/completions", dict(reqs[0], max_tokens=200)), 503, code="kv_cache_full")
    finally:
        assert s.stop() == 0


def test_full_queue_503_and_disconnect_cancels(chat_dir):
    s = Server(chat_dir, "--parallel", 1, "--queue", 1)
    try:
        c = s.client(timeout=120)
        long = dict(model=s.id, prompt="The", max_tokens=32000, temperature=0)  # seconds, unless cancelled
        first = c.completions.create(stream=True, **long)
        next(iter(first))  # running
        waiting = ThreadPoolExecutor(1).submit(lambda: c.completions.create(**dict(long, max_tokens=5)))
        time.sleep(0.3)  # queued behind the first
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(**long)
        assert e.value.status_code == 503
        first.close()  # the client leaves: its request is cancelled, the queued one runs
        assert waiting.result(timeout=60).usage.completion_tokens == 5
        assert metric(s, "mhsa_requests_cancelled_total") >= 1
        for _ in range(100):  # the gauges are updated just after the last request is told it finished
            if metric(s, "mhsa_batch_size") == 0 and metric(s, "mhsa_queue_length") == 0:
                break
            time.sleep(0.05)
        assert metric(s, "mhsa_batch_size") == 0 and metric(s, "mhsa_queue_length") == 0
    finally:
        assert s.stop() == 0


def test_kv_pool_full_queues_then_503_and_blocks_come_back(chat_dir):
    # 2001 blocks of 16 tokens: a prompt of one token + 32000 takes every block.
    s = Server(chat_dir, "--parallel", 4, "--queue", 1, "--kv-blocks", 2001)
    try:
        c = s.client(timeout=120)
        long = dict(model=s.id, prompt="The", max_tokens=32000, temperature=0)
        assert_error(post(s.url + "/v1/completions", dict(long, max_tokens=32100)), 503, code="kv_cache_full")
        first = c.completions.create(stream=True, **long)
        next(iter(first))  # running, its blocks promised
        waiting = ThreadPoolExecutor(1).submit(lambda: c.completions.create(**dict(long, max_tokens=5)))
        for _ in range(100):  # a place is free (--parallel 4), blocks are not: it waits in the queue
            if metric(s, "mhsa_queue_length") == 1:
                break
            time.sleep(0.05)
        assert metric(s, "mhsa_queue_length") == 1 and metric(s, "mhsa_batch_size") == 1
        # one scrape: a running sequence turns a promised block into a used one every 16 tokens
        assert sum(metric(s, "mhsa_kv_blocks_used", "mhsa_kv_blocks_reserved")) == 2001
        with pytest.raises(openai.APIStatusError) as e:  # the queue (1) is full
            c.completions.create(**long)
        assert e.value.status_code == 503
        first.close()  # the client leaves: its blocks come back, the queued request runs
        assert waiting.result(timeout=60).usage.completion_tokens == 5
        for _ in range(100):
            if metric(s, "mhsa_batch_size") == 0 and metric(s, "mhsa_kv_blocks_used") == 0:
                break
            time.sleep(0.05)
        assert metric(s, "mhsa_kv_blocks_used") == 0 and metric(s, "mhsa_kv_blocks_reserved") == 0
        assert metric(s, "mhsa_kv_blocks_free") == 2001
    finally:
        assert s.stop() == 0


def available_memory():
    with open("/proc/meminfo") as f:
        return int(re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def test_kv_pool_memory_at_startup_or_as_it_fills(gpt2_dir):
    # auto (the default), a pool far below the memory available: all of it before the first request
    s = Server(gpt2_dir, "--parallel", 2)
    try:
        total, allocated, blocks, block = metric(s, "mhsa_kv_bytes_total", "mhsa_kv_bytes_allocated",
                                                 "mhsa_kv_blocks_total", "mhsa_kv_block_bytes")
        assert blocks == 2 * 128 / 16 and total == blocks * -(-block // 64) * 64 and allocated == total
        assert f"KV cache of {int(total)} bytes (" in s.ready and "allocated," in s.ready, s.ready
    finally:
        assert s.stop() == 0
    # lazy: nothing until a request takes blocks, then whole slabs of them, never more than the pool
    s = Server(gpt2_dir, "--parallel", 2, "--kv-alloc", "lazy")
    try:
        assert metric(s, "mhsa_kv_bytes_total", "mhsa_kv_bytes_allocated") == [total, 0]
        assert "allocated as it fills" in s.ready, s.ready
        r = s.client().completions.create(model=s.id, prompt="Hello", max_tokens=20, temperature=0)
        assert r.usage.completion_tokens == 20
        assert 0 < metric(s, "mhsa_kv_bytes_allocated") <= total
    finally:
        assert s.stop() == 0
    # a pool of twice the memory available: startup refuses it by name before allocating anything;
    # auto takes it as it fills (a note says so) and serves
    many = 2 * available_memory() // int(block) + 1
    if many > 2**30:  # --kv-blocks' bound: a machine with more than ~8 TB
        return
    r = subprocess.run([str(CLI), "serve", "-t", "1", "--model", str(gpt2_dir), "--port", "0", "--kv-blocks", str(many),
                        "--kv-alloc", "startup"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert (f"mhsa: error: --kv-alloc startup: expected the KV cache ({many} blocks of 16 tokens," in r.stderr
            and "to fit in the memory available" in r.stderr and "--kv-alloc lazy" in r.stderr), r.stderr
    s = Server(gpt2_dir, "--kv-blocks", many)
    try:
        assert "allocated as it fills" in s.ready, s.ready
        r = s.client().completions.create(model=s.id, prompt="Hello", max_tokens=5, temperature=0)
        assert r.usage.completion_tokens == 5
        assert 0 < metric(s, "mhsa_kv_bytes_allocated") < metric(s, "mhsa_kv_bytes_total")
    finally:
        assert s.stop() == 0
    assert "is more than 3/4 of the memory available" in s.stderr()


def test_shared_prompt_prefix_is_prefilled_once(gpt2, gpt2_dir, rng):
    system = words(rng, 40)
    prompts = [system + " fox", system + " dog"]
    hits, tokens = metric(gpt2, "mhsa_prefix_cache_hits_total"), metric(gpt2, "mhsa_prefix_cache_tokens_total")
    for p in prompts:  # one after the other: the second finds the first's blocks
        r = gpt2.client().completions.create(model=gpt2.id, prompt=p, max_tokens=6, temperature=0)
        assert r.choices[0].text == generate(gpt2_dir, p, 6)["text"]
    assert r.usage.prompt_tokens_details.cached_tokens >= 16
    assert metric(gpt2, "mhsa_prefix_cache_hits_total") >= hits + 1
    assert metric(gpt2, "mhsa_prefix_cache_tokens_total") >= tokens + 16


def test_sigterm_while_streaming_exits_0(chat_dir):
    s = Server(chat_dir)
    stream = s.client().completions.create(model=s.id, prompt="The", max_tokens=32000, temperature=0, stream=True)
    next(iter(stream))
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=30) == 0
    assert "stopped" in s.proc.stdout.read()


def test_usage_errors_exit_2(gpt2, gpt2_dir):
    for args, text in [(["--port", 70000], "--port: expected an integer in [0, 65535]"),
                       (["--parallel", 0], "--parallel: expected an integer in [1, 256]"),
                       (["--ctx-size", 129], "--ctx-size: expected at most 128 (the model's context), got 129"),
                       (["--kv-alloc", "sometimes"], "--kv-alloc: expected auto, startup or lazy, got 'sometimes'"),
                       (["--port", gpt2.port], "cannot bind")]:
        r = subprocess.run([str(CLI), "serve", "-t", "1", "--model", str(gpt2_dir), *map(str, args)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and text in r.stderr, r.stderr


@pytest.mark.parametrize("dtype", ["bf16", "f16", "q8_0"])
def test_serve_dtype_equals_generate(gpt2_dir, dtype, rng):
    # `--dtype` as on `mhsa generate`: the weights kept as bfloat16, float16 or Q8_0 blocks (the ready line
    # says which). One request at a time, so every step has generate's rows: greedy completions are
    # generate's with the same dtype.
    s = Server(gpt2_dir, "--dtype", dtype, "--parallel", 1)
    try:
        assert f"{dtype} weights, f32 KV cache" in s.ready, s.ready
        for _ in range(3):
            prompt, n = words(rng, rng.randint(2, 8)), rng.randint(20, 40)
            ref = generate(gpt2_dir, prompt, n, "--dtype", dtype)
            r = s.client().completions.create(model=s.id, prompt=prompt, max_tokens=n, temperature=0)
            assert r.choices[0].text == ref["text"], (dtype, prompt)
            assert r.usage.completion_tokens == len(ref["tokens"])
        # Blocks go back at the end of the step that finished the request, which may come after
        # its response: wait for it, boundedly.
        deadline = time.monotonic() + 10
        while metric(s, "mhsa_kv_blocks_used") != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(s, "mhsa_kv_blocks_used") == 0
    finally:
        assert s.stop() == 0
    r = subprocess.run([str(CLI), "serve", "-t", "1", "--model", str(gpt2_dir), "--dtype", "q9"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--dtype" in r.stderr and "q9" in r.stderr, r.stderr
