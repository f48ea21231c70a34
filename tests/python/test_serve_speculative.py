"""Speculative decoding inside `mhsa serve` (prompt lookup, per request, inside continuous batching),
against the default model (SmolLM2-135M-Instruct, models/smollm2/) through the official `openai`
client. Two servers on the same weights in float32: the default (greedy requests guess) and
`--draft 0` (none).

- Greedy answers to input-grounded prompts (copy, correct, repeat a list: texts drawn at random
  from Debian's licence texts) are the `--draft 0` server's token for token, alone and with four
  clients at once (a step keeps to the rows that give each row a lone step's bits; float32 weights,
  so that a step lengthened by another request's prompt changes logits only by float rounding, as
  it does without speculation: docs/speculative.md, "In the server");
- /metrics counts the guesses checked and kept and the forwards (tokens per forward above one),
  the access log says each request's guesses; the `--draft 0` server guesses nothing;
- a sampled request still runs (without --draft, sampled requests do not guess).
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENCES = Path("/usr/share/common-licenses")
TOKENS = 32


class Server:
    """`mhsa serve --port 0` with stderr in a file (the access log), url read from its first line."""

    def __init__(self, model, *args):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([str(CLI), "serve", "-t", "1", "--model", str(model), "--port", "0",
                                      *map(str, args)], stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://[\d.]+:(\d+)) \(model ([^,]+),", line)
        assert m, f"no URL in {line!r}; stderr: {self.stderr()}"
        self.url, self.id = m.group(1), m.group(3)

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def metrics(self):
        import urllib.request
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        return {k: float(v) for k, v in re.findall(r"^(mhsa_[a-z_]+) ([-\d.e+]+)$", text, re.M)}

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def servers():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: scripts/setup.sh downloads it")
    args = ("--dtype", "f32", "--parallel", 4, "--ctx-size", 1024, "--prompt-cache-ram", 0)
    spec, plain = Server(GGUF, *args), Server(GGUF, *args, "--draft", 0)
    yield spec, plain
    assert spec.stop() == 0 and plain.stop() == 0


def grounded_prompts(rng, count):
    """Input-grounded chat prompts over sentences drawn at random from Debian's licence texts."""
    text = " ".join((LICENCES / name).read_text() for name in ("Apache-2.0", "GPL-3", "BSD"))
    sentences = [s.strip() + "." for s in re.split(r"\.\s+", " ".join(text.split())) if 40 < len(s) < 200]
    out = []
    for i in range(count):
        picked = " ".join(sentences[j] for j in rng.choice(len(sentences), 3, replace=False))
        kind = i % 3
        if kind == 0:
            out.append(f"Copy the following text exactly, word for word.\n\n{picked}")
        elif kind == 1:
            typos = picked.replace("the ", "teh ", 2).replace("tion", "tino", 1)
            out.append(f"Fix the spelling mistakes in this text and return the whole corrected text.\n\n{typos}")
        else:
            out.append("Turn this text into a numbered list, one sentence per item, each sentence unchanged.\n\n" + picked)
    return out


def ask(server, prompt, **kw):
    r = server.client().chat.completions.create(model="any", messages=[{"role": "user", "content": prompt}],
                                                max_tokens=TOKENS, **{"temperature": 0, **kw})
    return r.choices[0].message.content, r.usage.completion_tokens


def test_greedy_answers_equal_plain_decoding_alone_and_batched(servers, rng):
    spec, plain = servers
    prompts = grounded_prompts(rng, 3)
    before = spec.metrics()
    alone = [ask(plain, p) for p in prompts]
    assert [ask(spec, p) for p in prompts] == alone
    after = spec.metrics()
    drafted = after["mhsa_speculative_guesses_total"] - before["mhsa_speculative_guesses_total"]
    accepted = after["mhsa_speculative_guesses_accepted_total"] - before["mhsa_speculative_guesses_accepted_total"]
    generated = after["mhsa_generated_tokens_total"] - before["mhsa_generated_tokens_total"]
    forwards = after["mhsa_decode_forwards_total"] - before["mhsa_decode_forwards_total"]
    assert 0 < accepted <= drafted
    assert forwards < generated  # more than one token a forward
    plain_metrics = plain.metrics()
    assert plain_metrics["mhsa_speculative_guesses_total"] == 0
    assert plain_metrics["mhsa_decode_forwards_total"] >= plain_metrics["mhsa_generated_tokens_total"]
    # Four clients at once: the same answers (rows of several sequences' guesses in one step).
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: ask(spec, p), prompts + prompts[:1]))
    assert together == alone + alone[:1]
    lines = [l for l in spec.stderr().splitlines() if "path=/v1/chat/completions status=200" in l]
    assert any(re.search(r" drafted=\d+ accepted=\d+ ", l) for l in lines), lines[-3:]


def test_sampled_request_runs_without_guessing_by_default(servers, rng):
    spec, _ = servers
    prompt = grounded_prompts(rng, 1)[0]
    before = spec.metrics()["mhsa_speculative_guesses_total"]
    text, tokens = ask(spec, prompt, temperature=0.8, seed=int(rng.integers(1 << 31)))
    assert 0 < tokens <= TOKENS and text
    assert spec.metrics()["mhsa_speculative_guesses_total"] == before
