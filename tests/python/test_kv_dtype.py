"""The 16-bit KV cache from Python and the CLI: Model.load/Model.random(kv_dtype=...), the caches
the model makes (new_cache, generate) holding bfloat16 / float16 keys and values, logits within the
rounding's bound of the float32 cache's and greedy tokens mostly equal; `--kv-dtype` on
`mhsa generate`, `mhsa chat` and `mhsa serve` (a bf16 pool: half the bytes per block, and a
completion equal to `mhsa generate --kv-dtype bf16`); bad values named."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import mhsa

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
DEFAULT_MODEL = ROOT / "models" / "default"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import write_gpt2_dir  # noqa: E402

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 211, "hidden_size": 48,
         "intermediate_size": 77, "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
         "max_position_embeddings": 256}


@pytest.mark.parametrize("kv, u", [("bf16", 2.0**-9), ("f16", 2.0**-12)])
def test_decode_over_16bit_cache_near_f32(rng, kv, u):
    seed = int(rng.integers(1 << 31))
    m32 = mhsa.Model.random(LLAMA, seed=seed)
    m16 = mhsa.Model.random(LLAMA, seed=seed, kv_dtype=kv)
    assert (m32.kv_dtype, m16.kv_dtype) == ("f32", kv)
    prompt = rng.integers(0, LLAMA["vocab_size"], size=int(rng.integers(30, 60)))
    c32, c16 = m32.new_cache(1, 128), m16.new_cache(1, 128)
    a = m32.extend(c32, prompt[None, :], last_only=True)
    b = m16.extend(c16, prompt[None, :], last_only=True)
    for step in range(16):
        # Each cached value rounded with relative error ≤ u moves the logits by a few u of their
        # scale; 16·u is the C++ test's bound (tests/cpp/test_kv_16bit.cpp explains it).
        diff = np.abs(a.astype(np.float64) - b).max()
        assert 0 < diff <= 16 * u * np.abs(a).max(), (step, diff)
        nxt = np.array([[int(np.argmax(a))]])
        a, b = m32.extend(c32, nxt, last_only=True), m16.extend(c16, nxt, last_only=True)
    # generate() makes its caches of the model's kv_dtype: its greedy tokens are those of a greedy
    # loop over a 16-bit cache (the same computation, bit for bit).
    c16 = m16.new_cache(1, 128)
    b = m16.extend(c16, prompt[None, :], last_only=True)
    want = []
    for _ in range(12):
        want.append(int(np.argmax(b)))
        b = m16.extend(c16, np.array([[want[-1]]]), last_only=True)
    got = np.asarray(m16.generate(prompt[None, :], 12, stop_at_eos=False))[0]
    assert got[len(prompt):].tolist() == want  # generate returns the prompt and the new tokens


def test_bad_kv_dtype_is_named():
    with pytest.raises(mhsa.Error, match=r'Model.random: kv_dtype: expected "f32", "bf16", "f16" or "q8_0", got \'fp8\''):
        mhsa.Model.random(LLAMA, kv_dtype="fp8")
    with pytest.raises(mhsa.Error, match=r"Model.load: kv_dtype: expected"):
        mhsa.Model.load(DEFAULT_MODEL, kv_dtype="F16")


def run(*args, input=None):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=300, input=input)


def test_cli_kv_dtype_options():
    outs = {}
    for kv in ("f32", "bf16", "f16"):
        r = run("generate", "-t", "1", "--prompt", "And God said", "-n", "24", "--json", "--kv-dtype", kv)
        assert r.returncode == 0, r.stderr
        outs[kv] = json.loads(r.stdout)["tokens"]
        assert len(outs[kv]) == 24
    # The default model is trained: its greedy continuation survives 16-bit keys and values.
    for kv in ("bf16", "f16"):
        assert np.mean(np.array(outs[kv]) == np.array(outs["f32"])) >= 0.75
    for cmd, extra in {"generate": ["--prompt", "x"], "chat": [], "serve": ["--port", "0"]}.items():
        r = run(cmd, "--kv-dtype", "fp8", *extra, input="")
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert 'mhsa: error: --kv-dtype: expected "f32", "bf16", "f16" or "q8_0", got \'fp8\'' in r.stderr, (cmd, r.stderr)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return write_gpt2_dir(tmp_path_factory.mktemp("gpt2-kv16"), seed=2468)


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics") as r:
        return int(re.search(rf"^{name} (\d+)$", r.read().decode(), re.M).group(1))


def completion(url, model, prompt, n):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["text"]


def test_serve_with_16bit_pool(gpt2_dir):
    bytes_per_block = {}
    for kv in ("f32", "bf16"):
        proc = subprocess.Popen([str(CLI), "serve", "-t", "1", "--model", str(gpt2_dir), "--port", "0", "--kv-dtype", kv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            m = re.search(r"listening on (http://[\d.]+:\d+)", proc.stdout.readline())
            assert m, proc.stderr.read()
            url = m.group(1)
            bytes_per_block[kv] = metric(url, "mhsa_kv_block_bytes")
            if kv == "bf16":
                got = completion(url, gpt2_dir.name, "The meaning of life is", 12)
                r = run("generate", "-t", "1", "--model", gpt2_dir, "--prompt", "The meaning of life is", "-n", "12",
                        "--json", "--kv-dtype", "bf16")
                assert r.returncode == 0, r.stderr
                assert got == json.loads(r.stdout)["text"]
                deadline = time.monotonic() + 10  # blocks go back at the end of the request's last step
                while metric(url, "mhsa_kv_blocks_used") != 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert metric(url, "mhsa_kv_blocks_used") == 0  # every block back after the request
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert bytes_per_block["bf16"] * 2 == bytes_per_block["f32"]
