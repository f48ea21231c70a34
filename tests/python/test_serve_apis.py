"""`mhsa serve`'s other conversation APIs, driven by their official clients: Anthropic's Messages
(`anthropic`: create, stream, stop sequences, errors, x-api-key) and OpenAI's Responses (`openai`:
create, stream, instructions and message items, max_output_tokens). On a tiny chat model, greedy
answers equal `mhsa chat --messages` (the oracle: same template, same tokens); on the default
model (SmolLM2-135M-Instruct) a factual question is answered through both. Mutated requests get
200 or a 400 in each API's own error shape, never a 500."""

import http.client
import json
import os
import random
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_chat_model import WORDS, write_chat_dir  # noqa: E402
from serve_process import Server  # noqa: E402


@pytest.fixture(scope="module")
def rng(request):
    seed = int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))
    print(f"MHSA_TEST_SEED={seed}")
    return random.Random(seed)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-apis")

    def edit(model, tok):  # answers that do not end at once
        model.lm_head.weight[tok.token_to_id("<|im_end|>")] = 0

    write_chat_dir(d, tokens=307, padding=0, max_positions=4096, seed=77, edit=edit)
    return d


@pytest.fixture(scope="module")
def server(chat_dir):
    s = Server(chat_dir, "--parallel", 2, "--ctx-size", 1024)
    yield s
    assert s.stop() == 0


def chat_answer(d, messages, n):
    r = subprocess.run([str(CLI), "chat", "-t", "1", "--model", str(d), "--messages", "-", "--json", "-n", str(n)],
                       input=json.dumps(messages), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def words(rng, k):
    return "".join(rng.choice(WORDS) for _ in range(k)).strip() or "Hello"


GREEDY = {"temperature": 0}  # the Messages client sends sampling settings as extra fields


# ---- Anthropic's Messages ------------------------------------------------------------------------

def test_messages_equal_mhsa_chat(server, chat_dir, rng):
    system, user = words(rng, 4), words(rng, 6)
    n = rng.randint(4, 30)
    ref = chat_answer(chat_dir, [{"role": "system", "content": system}, {"role": "user", "content": user}], n)
    c = server.anthropic()
    m = c.messages.create(model="claude-any-name", max_tokens=n, system=system,
                          messages=[{"role": "user", "content": user}], extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ref["content"]
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[ref["finish_reason"]]
    assert m.stop_sequence is None
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ref["prompt_tokens"]
    assert m.usage.output_tokens == ref["completion_tokens"]
    # The same through text blocks (system and content), streamed.
    with c.messages.stream(model="x", max_tokens=n, system=[{"type": "text", "text": system}],
                           messages=[{"role": "user", "content": [{"type": "text", "text": user}]}],
                           extra_body=GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == ref["content"] and final.content[0].text == ref["content"]
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_messages_multi_turn_and_stop_sequences(server, chat_dir, rng):
    history = [{"role": "user", "content": words(rng, 5)}, {"role": "assistant", "content": words(rng, 5)},
               {"role": "user", "content": words(rng, 3)}]
    ref = chat_answer(chat_dir, history, 40)
    c = server.anthropic()
    m = c.messages.create(model="x", max_tokens=40, messages=history, extra_body=GREEDY)
    assert m.content[0].text == ref["content"]
    text = ref["content"]
    if len(text) < 6:
        pytest.skip(f"answer too short to cut: {text!r}")
    stop = text[len(text) // 2: len(text) // 2 + 3]
    m2 = c.messages.create(model="x", max_tokens=40, messages=history, stop_sequences=["never seen \u2603", stop],
                           extra_body=GREEDY)
    assert m2.stop_reason == "stop_sequence" and m2.stop_sequence == stop
    assert m2.content[0].text == text[:text.index(stop)]
    with c.messages.stream(model="x", max_tokens=40, messages=history, stop_sequences=[stop], extra_body=GREEDY) as s:
        assert "".join(s.text_stream) == m2.content[0].text
        f = s.get_final_message()
    assert f.stop_reason == "stop_sequence" and f.stop_sequence == stop


def test_a_final_assistant_message_is_continued(server, chat_dir, rng):
    """A prefill: the answer goes on from the assistant's words, as /v1/completions goes on from
    the conversation rendered with transformers' continue_final_message."""
    messages = [{"role": "user", "content": words(rng, 5)}, {"role": "assistant", "content": words(rng, 3)}]
    tok = transformers.AutoTokenizer.from_pretrained(chat_dir)
    rendered = tok.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    c = server.anthropic()
    m = c.messages.create(model="x", max_tokens=12, messages=messages, extra_body=GREEDY)
    completion = server.client().completions.create(model=chat_dir.name, prompt=rendered, max_tokens=12, temperature=0)
    assert m.content[0].text == completion.choices[0].text
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == completion.usage.prompt_tokens


def test_messages_mistakes_are_400s_naming_the_field(server):
    c = server.anthropic()
    base = {"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "Hello"}]}
    cases = [
        ({"temperature": 1.5}, "temperature"),  # Anthropic's range is [0, 1]
        ({"frobnicate": 1}, "frobnicate"),
        ({"tools": [{"name": "f b", "input_schema": {"type": "object"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The "}]}, "messages[1].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format"),
    ]
    for change, name in cases:
        body = {**base, **change}
        with pytest.raises(anthropic.BadRequestError) as e:
            c.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
        assert e.value.status_code == 400
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
        assert name in e.value.body["error"]["message"], (change, e.value.body)
    no_max = dict(base)
    del no_max["max_tokens"]
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        c.post("/v1/messages", body=no_max, cast_to=anthropic.types.Message)


def test_api_key_in_either_header(chat_dir):
    s = Server(chat_dir, "--api-key", "s3cret")
    try:
        with pytest.raises(anthropic.AuthenticationError):
            s.anthropic("wrong").messages.create(model="x", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        assert s.anthropic("s3cret").messages.create(model="x", max_tokens=2,
                                                     messages=[{"role": "user", "content": "Hi"}]).usage.output_tokens == 2
        r = s.client("s3cret").responses.create(model="x", input="Hi", max_output_tokens=2)
        assert r.usage.output_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").responses.create(model="x", input="Hi", max_output_tokens=2)
    finally:
        assert s.stop() == 0


# ---- OpenAI's Responses ---------------------------------------------------------------------------

def test_responses_equal_mhsa_chat(server, chat_dir, rng):
    system, user = words(rng, 4), words(rng, 6)
    n = rng.randint(4, 30)
    ref = chat_answer(chat_dir, [{"role": "system", "content": system}, {"role": "user", "content": user}], n)
    c = server.client()
    r = c.responses.create(model="gpt-any-name", instructions=system, input=user, max_output_tokens=n, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == ref["content"]
    assert r.status == {"stop": "completed", "length": "incomplete"}[ref["finish_reason"]]
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == ref["prompt_tokens"] and r.usage.output_tokens == ref["completion_tokens"]
    assert r.instructions == system and r.max_output_tokens == n
    # Message items (a developer message is the system's place), streamed.
    items = [{"role": "developer", "content": system},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}]
    events = list(c.responses.create(model="x", input=items, max_output_tokens=n, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if r.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ref["content"]
    assert events[-1].response.output_text == ref["content"] and events[-1].response.status == r.status
    # A conversation with an assistant turn.
    history = [{"role": "user", "content": user}, {"role": "assistant", "content": words(rng, 3)},
               {"role": "user", "content": words(rng, 3)}]
    ref2 = chat_answer(chat_dir, history, 20)
    r2 = c.responses.create(model="x", input=history, max_output_tokens=20, temperature=0)
    assert r2.output_text == ref2["content"]


def test_responses_mistakes_are_400s_naming_the_field(server):
    c = server.client()
    cases = [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].function.parameters"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{no"}]},
         "input[0].arguments"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
        ({"input": []}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ]
    for change, name in cases:
        body = {"model": "x", "input": "Hello", "max_output_tokens": 4, **change}
        with pytest.raises(openai.BadRequestError) as e:
            c.post("/responses", body=body, cast_to=openai.types.responses.Response)
        err = e.value.body
        assert name in err["message"] and err["type"] == "invalid_request_error", (change, err)


# ---- both: hostile requests -------------------------------------------------------------------

HOSTILE = [None, True, 0, -1, 2**63, 1e308, float("nan"), "", "x", "\ud800", [], [1], [[]], {}, {"type": "text"},
           [{"type": "text", "text": 5}], [{"role": "user"}], [{"role": "user", "content": None}]]


def mutate(rng, base, fields):
    body = json.loads(json.dumps(base))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):  # (a third of them valid, or cut below)
        if rng.random() < 0.7:
            body[rng.choice(fields)] = rng.choice(HOSTILE)
        elif body:
            body.pop(rng.choice(list(body)))
    text = json.dumps(body).encode()
    if rng.random() < 0.1:
        text = text[:rng.randrange(len(text) + 1)]
    return text


@pytest.mark.parametrize("path,base,fields,shape", [
    ("/v1/messages", {"model": "x", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]},
     ["model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
      "metadata", "tools", "thinking", "cache_control", "speed", "unknown"], "anthropic"),
    ("/v1/responses", {"model": "x", "max_output_tokens": 3, "input": "Hi"},
     ["model", "max_output_tokens", "input", "instructions", "stream", "temperature", "top_p", "store", "metadata",
      "text", "tools", "tool_choice", "truncation", "unknown"], "openai"),
])
def test_mutated_requests_get_documented_answers(server, rng, path, base, fields, shape):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    statuses = {}
    for i in range(120):
        body = mutate(rng, base, fields)
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
        what = f"{body[:300]!r} -> {r.status} {data[:300]!r}"
        assert r.status in (200, 400), what
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            assert r.status == 200 and b"event: " in data, what
        elif r.status != 200:
            j = json.loads(data)
            err = j["error"]
            assert err["message"], what
            if shape == "anthropic":
                assert j["type"] == "error" and err["type"] == "invalid_request_error", what
        if r.getheader("Connection", "").lower() == "close":
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.close()
    assert statuses.get(200, 0) >= 10 and statuses.get(400, 0) >= 40, statuses


# ---- the default model ----------------------------------------------------------------------------

def test_the_default_model_answers_through_both_apis():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: scripts/setup.sh downloads it")
    env = {k: v for k, v in os.environ.items() if k not in ("MHSA_MODEL", "MHSA_MODELS_DIR")}
    s = Server(GGUF, "--ctx-size", 512, env=env)
    try:
        question = [{"role": "user", "content": "What is the capital of France?"}]
        m = s.anthropic().messages.create(model="x", max_tokens=24, messages=question, extra_body=GREEDY)
        assert "Paris" in m.content[0].text and m.stop_reason == "end_turn"
        with s.anthropic().messages.stream(model="x", max_tokens=24, messages=question, extra_body=GREEDY) as st:
            assert "".join(st.text_stream) == m.content[0].text
        r = s.client().responses.create(model="x", input=question, max_output_tokens=24, temperature=0)
        assert r.output_text == m.content[0].text and r.status == "completed"
        # A tool round trip: a named tool is called, streamed as whole, and its result answered.
        tools = [{"name": "get_weather", "description": "Get the current weather in a city",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
        weather = [{"role": "user", "content": "What is the weather in Paris?"}]
        choice = {"type": "tool", "name": "get_weather"}
        t = s.anthropic().messages.create(model="x", max_tokens=40, messages=weather, tools=tools, tool_choice=choice,
                                          extra_body=GREEDY)
        assert t.stop_reason == "tool_use", t
        (use,) = [b for b in t.content if b.type == "tool_use"]
        assert use.name == "get_weather" and use.id.startswith("toolu_") and isinstance(use.input, dict)
        with s.anthropic().messages.stream(model="x", max_tokens=40, messages=weather, tools=tools, tool_choice=choice,
                                           extra_body=GREEDY) as st:
            f = st.get_final_message()
        assert [(b.name, b.input) for b in f.content if b.type == "tool_use"] == [(use.name, use.input)]
        assert f.stop_reason == "tool_use"
        history = weather + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in t.content]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                           "content": "21 degrees and clear"}]}]
        answer = s.anthropic().messages.create(model="x", max_tokens=40, messages=history, tools=tools, extra_body=GREEDY)
        assert answer.content[0].type == "text" and answer.content[0].text
        assert answer.stop_reason in ("end_turn", "max_tokens")
        # The same through Responses: a function_call item, streamed as its events, and its output answered.
        rtools = [{"type": "function", "name": "get_weather", "description": tools[0]["description"],
                   "parameters": tools[0]["input_schema"]}]
        o = s.client()
        kw = dict(model="x", tools=rtools, tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                  max_output_tokens=40)
        rr = o.responses.create(input=weather, **kw)
        (fc,) = [item for item in rr.output if item.type == "function_call"]
        assert fc.name == "get_weather" and isinstance(json.loads(fc.arguments), dict) and fc.status == "completed"
        events = list(o.responses.create(input=weather, stream=True, **kw))
        assert [(e.name, e.arguments) for e in events if e.type == "response.function_call_arguments.done"] == \
            [(fc.name, fc.arguments)]
        assert [i.type for i in events[-1].response.output] == [i.type for i in rr.output]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        followed = weather + [fc.model_dump(exclude_none=True),
                              {"type": "function_call_output", "call_id": fc.call_id, "output": "21 degrees and clear"}]
        rr2 = o.responses.create(model="x", input=followed, tools=rtools, temperature=0, max_output_tokens=40)
        assert rr2.output_text and rr2.output[0].type == "message"
    finally:
        assert s.stop() == 0
