"""Constrained decoding with the real default model (SmolLM2-135M-Instruct, models/smollm2/).

- `mhsa serve` driven by the official `openai` client: response_format json_schema (strict) over 30
  varied schemas gives text that parses and validates against its schema (Python's `jsonschema` the
  judge) every time; json_object gives a JSON object; a GBNF `grammar` field gives a sentence of it
  on /v1/completions; a schema mhsa does not support, or a grammar with a syntax error, is a 400
  naming the parameter and the place.
- Batched with schemas: eight concurrent requests, each with its own schema, each give an instance
  of it, and at least six of them the text they gave alone (greedy; a near-tie may flip a token).
- `mhsa generate --json-schema` and `mhsa chat --json-schema` give valid JSON; `--grammar` names
  the file and position of a syntax error.
- Python: Model.generate(json_schema=..., tokenizer=...) and ChatSession(json_schema=...).
"""

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

import mhsa  # noqa: E402
from serve_process import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

S = {"type": "string", "maxLength": 12}
I = {"type": "integer"}

# Small, varied: every supported keyword, nesting, $defs/$ref, anyOf, enums, consts, arrays with
# limits, optional properties, nulls. Strings are bounded so that a 135M model finishes quickly.
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": I}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": S, "country": S}, "required": ["city", "country"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"type": ["integer", "null"]}}, "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "point"}, "n": I}, "required": ["kind", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"first": S, "last": S},
                                                 "required": ["first", "last"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"anyOf": [I, S]}}, "required": ["id"], "additionalProperties": False},
    {"type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}, "q": {"$ref": "#/$defs/pt"}}, "required": ["p", "q"],
     "additionalProperties": False,
     "$defs": {"pt": {"type": "object", "properties": {"x": I, "y": I}, "required": ["x", "y"], "additionalProperties": False}}},
    {"type": "array", "items": I, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"title": S, "year": I, "rating": {"type": "number"}},
     "required": ["title", "year", "rating"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}, "required": ["ok", "note"],
     "additionalProperties": False},
    {"type": "object", "properties": {"a": S, "b": S}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"size": {"enum": ["S", "M", "L", "XL"]}, "qty": I}, "required": ["size", "qty"],
     "additionalProperties": False},
    {"type": "object", "properties": {"m": {"type": "array", "items": {"type": "array", "items": I, "maxItems": 2}, "maxItems": 2}},
     "required": ["m"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"anyOf": [{"const": "done"}, {"type": "object", "properties": {"left": I},
                                                                                "required": ["left"], "additionalProperties": False}]}},
     "required": ["status"], "additionalProperties": False},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 2, "maxLength": 8}}, "required": ["word"],
     "additionalProperties": False},
    {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}, "name": S},
     "required": ["lat", "lon", "name"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"n": S, "q": I},
                                                                          "required": ["n", "q"], "additionalProperties": False},
                                                "maxItems": 2}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"yes": {"type": "boolean"}, "why": S}, "required": ["yes", "why"], "additionalProperties": False},
    {"enum": ["alpha", "beta", 3, None]},
    {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}}, "required": ["level"], "additionalProperties": False},
    {"type": "object", "properties": {"first": I, "rest": {"type": "array", "items": I, "maxItems": 3}}, "required": ["first", "rest"],
     "additionalProperties": False},
    {"type": "object", "properties": {"meta": {"type": "object", "properties": {"v": {"const": 1}}, "required": ["v"],
                                               "additionalProperties": False}, "data": {"type": ["string", "null"], "maxLength": 6}},
     "required": ["meta", "data"], "additionalProperties": False},
    {"type": "object", "properties": {"k": {"$ref": "#/definitions/k"}}, "required": ["k"], "additionalProperties": False,
     "definitions": {"k": {"enum": ["on", "off"]}}},
    {"type": "object", "properties": {"empty": {"type": "object", "properties": {}, "additionalProperties": False}},
     "required": ["empty"], "additionalProperties": False},
    {"type": "boolean"},
    {"type": "object", "title": "Pet", "description": "a pet", "properties": {"species": {"enum": ["cat", "dog"]}, "legs": I},
     "required": ["species", "legs"], "additionalProperties": False},
]
assert len(SCHEMAS) == 30


@pytest.fixture(scope="module")
def server():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: scripts/setup.sh downloads it")
    s = Server(GGUF, "--parallel", "8", "--dtype", "q8_0")
    yield s
    assert s.stop() == 0


def ask(server, i, schema, max_tokens=96):
    r = server.client().chat.completions.create(
        model=GGUF.name, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "user", "content": f"Give an example as JSON. Example {i}."}],
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_json_schema_strict_over_30_schemas_validates(server):
    answers = {}
    for i, schema in enumerate(SCHEMAS):
        text, finish = ask(server, i, schema)
        assert finish == "stop", (i, text)
        jsonschema.validate(json.loads(text), schema)
        answers[i] = text
    # Batched: eight at once, each with its own schema, each held by its own grammar state. A batched
    # step's logits equal a lone request's only up to float32 rounding (a decoding row beside
    # prefilling rows takes the GEMM instead of the 8-bit stream), so a near-tie may flip a token:
    # every answer must still be an instance of its own schema, and most must be what they were alone.
    picks = [0, 5, 10, 11, 16, 20, 24, 29]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: ask(server, i, SCHEMAS[i]), picks))
    for i, (text, finish) in zip(picks, together):
        assert finish == "stop", (i, text)
        jsonschema.validate(json.loads(text), SCHEMAS[i])
    same = sum(text == answers[i] for i, (text, _) in zip(picks, together))
    assert same >= 6, [(i, text, answers[i]) for i, (text, _) in zip(picks, together) if text != answers[i]]


def test_json_object_and_grammar(server):
    r = server.client().chat.completions.create(
        model=GGUF.name, max_tokens=48, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with exactly this JSON: {"ok": true}'}])
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    grammar = 'root ::= "The answer is " ( "yes" | "no" ) "."\n'
    r = server.client().completions.create(model=GGUF.name, prompt="Is the sky blue?", max_tokens=20, temperature=0,
                                         extra_body={"grammar": grammar})
    assert r.choices[0].text in ("The answer is yes.", "The answer is no.")
    assert r.choices[0].finish_reason == "stop"
    # Streamed: the same text in pieces.
    stream = server.client().completions.create(model=GGUF.name, prompt="Is the sky blue?", max_tokens=20, temperature=0,
                                              extra_body={"grammar": grammar}, stream=True)
    assert "".join(c.choices[0].text for c in stream) == r.choices[0].text


def test_bad_schema_or_grammar_is_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        ask(server, 0, {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "at /properties/a/pattern: 'pattern' is not supported" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model=GGUF.name, prompt="x", max_tokens=5, extra_body={"grammar": 'root ::= ("a"'})
    assert e.value.body["param"] == "grammar" and "grammar:1:14: expected ')'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model=GGUF.name, max_tokens=5, messages=[{"role": "user", "content": "x"}],
                                              response_format={"type": "yaml"})
    assert e.value.body["param"] == "response_format.type"


def run(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("MHSA_MODEL", "MHSA_MODELS_DIR")}
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def test_cli_generate_and_chat_json_schema(tmp_path):
    schema = SCHEMAS[0]
    f = tmp_path / "person.json"
    f.write_text(json.dumps(schema))
    r = run("generate", "--model", GGUF, "-t", "2", "--prompt", "A person as JSON:", "-n", "64", "--json", "--json-schema", f)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(json.loads(r.stdout)["text"]), schema)
    r = run("chat", "--model", GGUF, "-t", "2", "--prompt", "Who wrote Hamlet? Answer as JSON.", "-n", "64", "--json-schema", f)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), schema)
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= "a"\nx ::= [b-\n')
    r = run("generate", "--model", GGUF, "--prompt", "x", "-n", "4", "--grammar", bad)
    assert r.returncode != 0 and f"{bad}:2:7: " in r.stderr, r.stderr
    r = run("generate", "--model", GGUF, "--prompt", "x", "-n", "4", "--json-schema", tmp_path / "missing.json")
    assert r.returncode != 0 and "--json-schema" in r.stderr and "missing.json" in r.stderr, r.stderr


def test_python_generate_and_chat_session():
    model = mhsa.Model.load(GGUF)
    tok = mhsa.Tokenizer.load(GGUF)
    schema = SCHEMAS[3]
    ids = tok.encode("The colour of grass as JSON:")
    out = model.generate(ids, 48, json_schema=schema, tokenizer=tok)
    new = [t for t in out[len(ids):].tolist() if t not in tok.eos_token_ids]
    jsonschema.validate(json.loads(tok.decode(new)), schema)
    chat = mhsa.ChatSession(model, tok, max_new_tokens=48, json_schema=json.dumps(schema))
    jsonschema.validate(json.loads(chat.send("What colour is the sky?")), schema)
    with pytest.raises(mhsa.Error, match="tokenizer"):
        model.generate(ids, 4, grammar='root ::= "a"')
