"""`mhsa serve`'s request hygiene and its small APIs (issue 47), against the default model
(SmolLM2-135M-Instruct, models/smollm2/) and a tiny random GPT-2:

- any `model` name is served; /v1/models lists the id, --alias names, the file's stem and "default";
- a field mhsa does not implement is a 400 naming it (`param`), through the official `openai`
  client; fields at OpenAI's neutral values (`n: 1`, `tools: []`, `store: false`, `user`) are accepted;
- one access-log line per request on stderr, with the client, status, bytes, tokens and duration and
  never a body or a key; none with --log-requests off;
- 600 connections that send nothing, only their headers, or trickle them do not delay a normal
  request; a Content-Length that is negative, garbage or over the limit is answered at once and the
  connection closed (timed with bounds loose enough for a loaded 2-core machine);
- /tokenize and /detokenize round trip and agree with `mhsa tokenize`; an id out of the vocabulary
  is a 400 naming its index;
- /v1/embeddings (the `openai` client's embeddings.create) is the mean of transformers'
  last_hidden_state over the input's tokens, L2-normalised, to 1e-4 (the tiny GPT-2: transformers
  takes ~50 s to load the default model's GGUF on a loaded 2-core machine); batched as alone;
  base64 as float; hostile inputs are 400s naming the field, and 240 mutated bodies of the three
  new endpoints are 200s or 400s, never a 500."""

import base64
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import write_gpt2_dir  # noqa: E402
from serve_process import Server  # noqa: E402


@pytest.fixture(scope="module")
def smol():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: scripts/setup.sh downloads it")
    s = Server(GGUF, "--dtype", "f32", "--parallel", 2, "--ctx-size", 512, "--alias", "gpt-4o", "--alias", "local")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return write_gpt2_dir(tmp_path_factory.mktemp("gpt2-hygiene"), seed=47)


@pytest.fixture(scope="module")
def gpt2(gpt2_dir):
    s = Server(gpt2_dir)
    yield s
    assert s.stop() == 0


def post(url, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    host, port = re.match(r"http://([\d.]+):(\d+)", url).groups()
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    path = url.split(port, 1)[1]
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def assert_400(status_body, param, code=None):
    status, body = status_body
    assert status == 400, body
    assert body["error"]["param"] == param, body
    if code:
        assert body["error"]["code"] == code, body


# ---- names and fields --------------------------------------------------------------------------

def test_any_model_name_is_served_and_aliases_are_listed(smol):
    c = smol.client(api_key="sk-not-a-real-key-1234")
    ids = [m.id for m in c.models.list().data]
    assert ids == [smol.id, "gpt-4o", "local", GGUF.stem, "default"]
    for name in ["gpt-4o", "gpt-3.5-turbo-instruct", "no-such-model"]:
        r = c.completions.create(model=name, prompt="The capital of France is", max_tokens=2, temperature=0)
        assert r.model == smol.id and r.usage.completion_tokens == 2
    assert_400(post(smol.url + "/v1/completions", {"prompt": "Hi", "model": 5}), "model")


def test_unimplemented_fields_are_400_naming_them(smol):
    c = smol.client(api_key="sk-not-a-real-key-1234")
    hi = [{"role": "user", "content": "Hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    refused = [
        (dict(tools=[{"type": "retrieval"}]), "tools[0].type", None),  # tools: test_serve_tools.py
        (dict(tool_choice="required"), "tool_choice", None),  # (without tools)
        (dict(n=2), "n", "unsupported_parameter"),
        (dict(store=True), "store", "unsupported_parameter"),
        (dict(reasoning_effort="low"), "reasoning_effort", "unsupported_parameter"),
        (dict(stream_options={"include_usage": True, "include_obfuscation": True}, stream=True),
         "stream_options.include_obfuscation", "unsupported_parameter"),
        (dict(extra_body={"top_k": 5}), "top_k", "unknown_parameter"),
        (dict(metadata="x"), "metadata", None),
    ]
    for kw, param, code in refused:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="any", messages=hi, max_tokens=1, **kw)
        err = e.value.body
        assert err["param"] == param and (code is None or err["code"] == code), (kw, err)
        assert param.split(".")[-1] in err["message"], err
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi", "name": "bob"}], max_tokens=1)
    assert e.value.body["param"] == "messages[0].name"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="any", prompt="Hi", max_tokens=1, extra_body={"unknown_field": {"x": [1]}})
    assert e.value.body["param"] == "unknown_field"
    with pytest.raises(openai.BadRequestError) as e:  # a chat-only field on /v1/completions
        c.completions.create(model="any", prompt="Hi", max_tokens=1, extra_body={"tools": []})
    assert e.value.body["param"] == "tools"
    # OpenAI's neutral values and the fields without effect are accepted
    r = c.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi", "tool_calls": []}],
                                  max_tokens=1, n=1, user="u-1", metadata={"k": "v"}, store=False, logit_bias={},
                                  tool_choice="none", response_format={"type": "text"}, parallel_tool_calls=True,
                                  service_tier="auto", stream=False,
                                  extra_body={"tools": [], "prompt_cache_key": "k", "safety_identifier": "s"})
    assert r.usage.completion_tokens == 1
    r = c.completions.create(model="any", prompt="Hi", max_tokens=1, n=1, best_of=1, echo=False, suffix="",
                             user="u-1", logit_bias={})
    assert r.usage.completion_tokens == 1


# ---- the access log ----------------------------------------------------------------------------

def log_lines(server, key, value):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # written by the server's log thread
        lines = [ln for ln in server.stderr().splitlines() if f" {key}={value} " in ln + " "]
        if lines:
            return lines
        time.sleep(0.05)
    return []


def test_one_access_log_line_per_request(smol):
    c = smol.client(api_key="sk-not-a-real-key-1234")
    secret = "PROMPT-TEXT-THAT-MUST-NOT-BE-LOGGED"
    r = c.completions.create(model="x", prompt=secret, max_tokens=3, temperature=0)
    (line,) = log_lines(smol, "id", r.id)
    m = re.fullmatch(r"time=(\S+) id=(\S+) client=127\.0\.0\.1:(\d+) method=POST path=/v1/completions status=200 "
                     r"bytes=(\d+) prompt_tokens=(\d+) completion_tokens=(\d+)(?: drafted=\d+ accepted=\d+)? "
                     r"duration=(\d+\.\d{3})", line)
    assert m, line
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", m.group(1))
    assert int(m.group(5)) == r.usage.prompt_tokens and int(m.group(6)) == 3 and int(m.group(4)) > 100
    stream = list(c.chat.completions.create(model="x", messages=[{"role": "user", "content": secret}], max_tokens=2,
                                            temperature=0, stream=True))
    (line,) = log_lines(smol, "id", stream[0].id)
    assert " status=200 " in line and " completion_tokens=2 " in line and "path=/v1/chat/completions" in line
    assert int(re.search(r" bytes=(\d+)", line).group(1)) > 200  # the streamed events counted
    status, body = post(smol.url + "/v1/nothing?x=1", {"a": secret})
    assert status == 404
    assert log_lines(smol, "path", "/v1/nothing") and "status=404" in log_lines(smol, "path", "/v1/nothing")[0]
    log = smol.stderr()
    assert secret not in log and "sk-not-a-real-key" not in log and "Bearer" not in log


def test_log_requests_off(gpt2_dir):
    s = Server(gpt2_dir, "--log-requests", "off")
    try:
        assert post(s.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200
    finally:
        assert s.stop() == 0
    assert "time=" not in s.stderr(), s.stderr()


# ---- slow and hostile connections --------------------------------------------------------------

def timed_completion(server):
    start = time.monotonic()
    status, body = post(server.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert status == 200, body
    return time.monotonic() - start


@pytest.mark.parametrize("kind", ["silent", "headers", "trickle"])
def test_idle_and_slow_connections_do_not_delay_others(gpt2, kind):
    """600 connections: more than the fixed pool of 256 threads that was here before (900 that sent
    their headers delayed a request by 11.6 s, 900 trickling ones by 60 s)."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    conns, stop = [], threading.Event()
    try:
        for _ in range(600):
            c = socket.create_connection(("127.0.0.1", gpt2.port), timeout=30)
            if kind == "headers":
                c.sendall(head)
            conns.append(c)

        def trickle():
            for i in range(len(head)):
                for c in conns:
                    try:
                        c.send(head[i:i + 1])
                    except OSError:
                        pass
                if stop.wait(0.5):
                    return

        t = threading.Thread(target=trickle, daemon=True)
        if kind == "trickle":
            t.start()
        time.sleep(0.3)
        took = timed_completion(gpt2)
        assert took < 2.0, f"a request behind 600 {kind} connections took {took:.1f} s"
    finally:
        stop.set()
        for c in conns:
            c.close()


@pytest.mark.parametrize("length, status", [(10**12, 413), (-5, 400), ("12x", 400)])
def test_bad_content_length_is_answered_and_closed_at_once(gpt2, length, status):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n{{").encode()
    with socket.create_connection(("127.0.0.1", gpt2.port), timeout=30) as c:
        start = time.monotonic()
        c.sendall(head)
        out = b""
        while chunk := c.recv(65536):  # until the server closes the connection
            out += chunk
        took = time.monotonic() - start
    assert out.startswith(f"HTTP/1.1 {status}".encode()), out[:300]
    assert b'"error"' in out and b"Connection: close" in out and str(length).encode() in out
    assert took < 1.0, f"closed after {took:.1f} s"
    assert timed_completion(gpt2) < 2.0


# ---- /tokenize and /detokenize -----------------------------------------------------------------

def cli_tokenize(*args):
    r = subprocess.run([str(CLI), "tokenize", "--json", "--model", str(GGUF), *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


def test_tokenize_detokenize_round_trip_equals_the_cli(smol):
    u = smol.url
    for text in ["Hello world", "  spaces\tand\nnewlines ", "héllo wörld ✓ 日本語", "<|im_start|>user\nHi<|im_end|>"]:
        status, body = post(u + "/tokenize", {"content": text})
        assert status == 200, body
        assert body["tokens"] == cli_tokenize(text), text
        assert post(u + "/detokenize", {"tokens": body["tokens"]}) == (200, {"content": text})
        status, pieces = post(u + "/tokenize", {"prompt": text, "with_pieces": True})
        assert [p["id"] for p in pieces["tokens"]] == body["tokens"]
        joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                          for p in pieces["tokens"])
        assert joined.decode() == text
    # special tokens written in the text: their ids unless parse_special is false
    status, plain = post(u + "/tokenize", {"content": "<|im_end|>", "parse_special": False})
    assert len(plain["tokens"]) > 1 and post(u + "/detokenize", plain)[1]["content"] == "<|im_end|>"
    # a piece of a character: its bytes as a list
    status, body = post(u + "/tokenize", {"content": "日", "with_pieces": True})
    assert all(isinstance(p["piece"], (str, list)) for p in body["tokens"])


def test_tokenize_and_detokenize_refuse_hostile_input(smol):
    u = smol.url
    assert_400(post(u + "/detokenize", {"tokens": [1, 2, 10**6]}), "tokens[2]")
    assert_400(post(u + "/detokenize", {"tokens": [-1]}), "tokens[0]")
    assert_400(post(u + "/detokenize", {"tokens": [2**64]}), "tokens[0]")
    assert_400(post(u + "/detokenize", {"tokens": [1.5]}), "tokens[0]")
    assert_400(post(u + "/detokenize", {"tokens": "abc"}), "tokens")
    assert_400(post(u + "/detokenize", {}), "tokens")
    assert_400(post(u + "/detokenize", {"tokens": [1], "extra": 1}), "extra", "unknown_parameter")
    assert_400(post(u + "/tokenize", {"content": 5}), "content")
    assert_400(post(u + "/tokenize", {}), "content")
    assert_400(post(u + "/tokenize", {"content": "a", "prompt": "b"}), "prompt")
    assert_400(post(u + "/tokenize", {"content": "a", "add_special": "yes"}), "add_special")
    assert_400(post(u + "/tokenize", [1]), "body")
    assert post(u + "/tokenize", b"{not json")[0] == 400
    assert post(u + "/detokenize", {"tokens": []}) == (200, {"content": ""})


# ---- /v1/embeddings ----------------------------------------------------------------------------

def test_embeddings_equal_transformers_mean_pooled(gpt2, gpt2_dir, smol):
    """Against transformers on the tiny GPT-2 (its last_hidden_state is after ln_f); on the default
    model, batched as alone, ids as text, base64 as float, and unit norm."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    texts = ["The capital of France is Paris.", "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)",
             "Hi"]
    r = gpt2.client(api_key="sk-not-a-real-key-1234").embeddings.create(model="text-embedding-3-small", input=texts)
    assert r.model == gpt2.id and [d.index for d in r.data] == [0, 1, 2]
    got = np.array([d.embedding for d in r.data])
    ids = [post(gpt2.url + "/tokenize", {"content": t})[1]["tokens"] for t in texts]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir, torch_dtype=torch.float32).eval()
    for i, x in enumerate(ids):
        with torch.no_grad():
            h = hf.transformer(torch.tensor([x])).last_hidden_state[0].double().numpy()  # after the final norm
        want = h.mean(axis=0)
        want /= np.linalg.norm(want)
        assert got[i].shape == (hf.config.n_embd,)
        np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-4)

    c = smol.client(api_key="sk-not-a-real-key-1234")
    got = np.array([d.embedding for d in c.embeddings.create(model="x", input=texts).data])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, rtol=0, atol=1e-5)
    alone = c.embeddings.create(model="x", input=texts[2]).data[0].embedding
    np.testing.assert_allclose(alone, got[2], rtol=0, atol=1e-5)
    ids = [post(smol.url + "/tokenize", {"content": t, "parse_special": False})[1]["tokens"] for t in texts]
    by_ids = c.embeddings.create(model="x", input=ids).data
    np.testing.assert_allclose([d.embedding for d in by_ids], got, rtol=0, atol=1e-6)
    status, body = post(smol.url + "/v1/embeddings", {"input": texts, "encoding_format": "base64"})
    assert status == 200
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]]
    np.testing.assert_allclose(decoded, got, rtol=0, atol=1e-6)
    assert len(c.embeddings.create(model="x", input="Hi", dimensions=576).data[0].embedding) == 576


def test_embeddings_refuse_hostile_input(smol):
    u = smol.url + "/v1/embeddings"
    assert_400(post(u, {}), "input")
    assert_400(post(u, {"input": []}), "input")
    assert_400(post(u, {"input": ""}), "input")
    assert_400(post(u, {"input": ["a", ""]}), "input[1]")
    assert_400(post(u, {"input": [[]]}), "input[0]")
    assert_400(post(u, {"input": [1, -2]}), "input[1]")
    assert_400(post(u, {"input": [[1], [10**9]]}), "input[1][0]")
    assert_400(post(u, {"input": [["a"]]}), "input[0][0]")
    assert_400(post(u, {"input": 5}), "input")
    assert_400(post(u, {"input": {"a": 1}}), "input")
    assert_400(post(u, {"input": ["a"] * 2049}), "input")
    assert_400(post(u, {"input": " fox" * 600}), "input", "context_length_exceeded")  # past --ctx-size 512
    assert_400(post(u, {"input": "a", "encoding_format": "float16"}), "encoding_format")
    assert_400(post(u, {"input": "a", "dimensions": 64}), "dimensions", "unsupported_parameter")
    assert_400(post(u, {"input": "a", "dimensions": "x"}), "dimensions")
    assert_400(post(u, {"input": "a", "pooling": "cls"}), "pooling", "unknown_parameter")
    assert post(u, {"input": "a", "user": "u"})[0] == 200


def test_new_endpoints_survive_mutated_requests(gpt2):
    """test_cli_serve.py's mutations (hostile values, fields removed, the JSON cut, flipped, given
    duplicate keys or invalid UTF-8) of valid /tokenize, /detokenize and /v1/embeddings bodies: 200
    or a 400/413 in OpenAI's error shape, never a 500, and the server keeps answering."""
    import random

    from test_cli_serve import mutated_body

    rng = random.Random(int(os.environ.get("MHSA_TEST_SEED") or 47))
    cases = [("/tokenize", {"content": "Hello world", "with_pieces": True}, ["content", "prompt", "add_special",
                                                                          "parse_special", "with_pieces", "x"]),
             ("/detokenize", {"tokens": [15496, 995]}, ["tokens", "model", "x"]),
             ("/v1/embeddings", {"input": ["Hello", "world"], "model": "m"}, ["input", "encoding_format",
                                                                              "dimensions", "user", "x"])]
    conn = http.client.HTTPConnection("127.0.0.1", gpt2.port, timeout=60)
    for path, base, fields in cases:
        for i in range(80):
            body = mutated_body(rng, base, fields)
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            what = f"{path} {body[:200]!r} -> {r.status} {data[:200]!r}"
            assert r.status in (200, 400, 413), what
            out = json.loads(data)
            if r.status != 200:
                assert set(out["error"]) == {"message", "type", "param", "code"}, what
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", gpt2.port, timeout=60)
    conn.close()
    assert timed_completion(gpt2) < 2.0
