"""Tools in `mhsa serve`'s chat completions, through the official `openai` client: a template that
renders tools itself (Qwen 2.5's) gets exactly the prompt transformers' apply_chat_template(tools=)
gives, calls and results in the history included; the default model (whose template knows no
tools: they are described in its system message) answers a named tool_choice with a call of that
function whose arguments validate against its schema (the call's grammar), streamed calls assemble into the unstreamed ones, a
tool round trip is answered, and tool_choice "none" gives text. Bad tools are 400s naming the field."""

import json
import os
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_chat_model import write_chat_dir  # noqa: E402
from serve_process import Server  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-tools")
    write_chat_dir(d, tokens=307, padding=0, max_positions=4096, seed=5, edit=lambda model, tok: None)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = (ROOT / "tests" / "data" / "chat_templates" / "qwen2.5.jinja").read_text()
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    s = Server(d, "--ctx-size", 2048)
    yield d, s
    assert s.stop() == 0


def test_a_template_with_tools_renders_as_transformers_does(qwen):
    d, s = qwen
    tok = transformers.AutoTokenizer.from_pretrained(d)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}]
    # transformers' templates see arguments as an object, OpenAI's clients send JSON text.
    as_hf = json.loads(json.dumps(history))
    as_hf[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    as_hf[2]["content"] = ""
    for tools, messages, hf in [([WEATHER], history[:2], as_hf[:2]), ([WEATHER, ADD], history, as_hf)]:
        expected = tok.apply_chat_template(hf, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(expected, dict):
            expected = expected["input_ids"]
        r = s.client().chat.completions.create(model=s.id, messages=messages, tools=tools, max_tokens=1, temperature=0)
        assert r.usage.prompt_tokens == len(expected), (tools, messages)


def test_bad_tools_are_400s_naming_the_field(qwen):
    _, s = qwen
    msgs = [{"role": "user", "content": "Hi"}]
    cases = [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": "get_weather"}, "tools"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                            "function": {"name": "f", "arguments": "{not json"}}]},
                       {"role": "user", "content": "Hi"}]}, "messages[0].tool_calls[0].function.arguments"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": "Hi", "tool_calls": [{"id": "c"}]}]}, "messages[0].tool_calls"),
    ]
    for change, name in cases:
        body = {"model": s.id, "messages": msgs, "max_tokens": 2, **change}
        with pytest.raises(openai.BadRequestError) as e:
            s.client().post("/chat/completions", body=body, cast_to=object)
        assert name in e.value.body["message"] and e.value.body["param"] is not None, (change, e.value.body)


def test_the_default_model_calls_a_named_tool():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: scripts/setup.sh downloads it")
    env = {k: v for k, v in os.environ.items() if k not in ("MHSA_MODEL", "MHSA_MODELS_DIR")}
    s = Server(GGUF, "--ctx-size", 1024, env=env)
    try:
        c = s.client()
        question = [{"role": "user", "content": "What is the weather in Paris?"}]
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = c.chat.completions.create(model=s.id, messages=question, tools=[WEATHER, ADD], tool_choice=named,
                                      temperature=0, max_tokens=40)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        # The call's grammar holds the arguments to the function's schema.
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        for tool in (WEATHER, ADD):  # "required" and each named tool: a call of a given function, valid
            for choice in ("required", {"type": "function", "function": {"name": tool["function"]["name"]}}):
                got = c.chat.completions.create(model=s.id, messages=question, tools=[WEATHER, ADD], tool_choice=choice,
                                                temperature=0, max_tokens=40).choices[0].message.tool_calls
                assert len(got) == 1, (choice, got)
                schema = {"get_weather": WEATHER, "add": ADD}[got[0].function.name]["function"]["parameters"]
                jsonschema.validate(json.loads(got[0].function.arguments), schema)
                if choice != "required":
                    assert got[0].function.name == tool["function"]["name"]
        # Streamed: the same calls, assembled from their deltas.
        chunks = list(c.chat.completions.create(model=s.id, messages=question, tools=[WEATHER, ADD],
                                                tool_choice=named, temperature=0, max_tokens=40, stream=True))
        calls = {}
        for ch in chunks:
            for d in ch.choices[0].delta.tool_calls or []:
                got = calls.setdefault(d.index, {"name": "", "arguments": ""})
                got["name"] += d.function.name or ""
                got["arguments"] += d.function.arguments or ""
        assert list(calls.values()) == [{"name": "get_weather", "arguments": call.function.arguments}]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # The round trip: the call and its result go back, and the model answers in text.
        history = question + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                              {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "celsius": 21}'}]
        r2 = c.chat.completions.create(model=s.id, messages=history, tools=[WEATHER], temperature=0, max_tokens=40)
        assert r2.choices[0].message.content and r2.choices[0].finish_reason in ("stop", "length")
        # tool_choice "none": text, never a call.
        r3 = c.chat.completions.create(model=s.id, messages=question, tools=[WEATHER], tool_choice="none",
                                       temperature=0, max_tokens=20)
        assert r3.choices[0].message.tool_calls is None and r3.choices[0].message.content
    finally:
        assert s.stop() == 0
