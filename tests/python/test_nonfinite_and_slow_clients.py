"""Issue 52's hostile cases that need a model or a running server (each test takes seconds):

- a model whose weights give NaN logits (a NaN in the tied GPT-2 embedding): `mhsa generate` printed
  the sampler's token 0 and exited 0, Python returned it; now generation stops with an error naming
  the new token, `mhsa generate` exits 2 with nothing but the prompt printed, `Model.generate`
  raises mhsa.Error, and `mhsa serve` answers that request 500 and goes on serving;
- `mhsa serve` under a cheap slowloris (64 connections silent after their headers delayed a normal
  request by ~19 s), a Content-Length of 10^12 (413 only after 5 s) and of -5 ("larger than
  1048576 bytes")."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

import mhsa

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import write_gpt2_dir  # noqa: E402
from serve_process import Server  # noqa: E402


@pytest.fixture(scope="module")
def nan_dir(tmp_path_factory):
    """A tiny GPT-2 whose tied embedding holds one NaN: token 0's logit is NaN at every step."""
    d = write_gpt2_dir(tmp_path_factory.mktemp("nan-gpt2"), seed=52)
    weights = safetensors.numpy.load_file(str(d / "model.safetensors"))
    name = next(k for k in weights if k.endswith("wte.weight"))
    weights[name][0, 0] = np.nan
    safetensors.numpy.save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def test_generate_stops_at_nan_logits(nan_dir):
    r = subprocess.run([str(CLI), "generate", "-t", "1", "--model", str(nan_dir), "--prompt", "Hello", "-n", "5"],
                       capture_output=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert b"\x00" not in r.stdout and b"!" not in r.stdout, r.stdout  # token 0 of GPT-2 is "!"
    assert (b"logits for new token 1: expected finite values (a weight or activation of the model "
            b"is not finite), got nan at token id 0") in r.stderr, r.stderr
    model = mhsa.Model.load(str(nan_dir))
    with pytest.raises(mhsa.Error, match=r"logits for new token 1 of sequence 0: expected finite values .*"
                                         r"got nan at token id 0"):
        model.generate(np.array([[15496, 11], [15496, 11]], dtype=np.int32), max_new_tokens=4)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status


def test_server_answers_nan_logits_500_and_goes_on(nan_dir):
    s = Server(nan_dir)
    try:
        for _ in range(2):  # each request fails alone; the server goes on
            status, body = post(s.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
            assert status == 500, body
            assert body["error"]["type"] == "server_error"
            assert "logits for new token 1: expected finite values" in body["error"]["message"], body
            assert get(s.url + "/health") == 200
    finally:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(write_gpt2_dir(tmp_path_factory.mktemp("gpt2-slow"), seed=7))
    yield s
    assert s.stop() == 0


def raw(port, data, timeout=30):
    """What comes back for `data` sent on a fresh connection, read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(data)
        out = b""
        try:
            while chunk := c.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and b'"error"' in out and out.rstrip().endswith(b"}"):
                    break  # the whole answer: the server may keep the connection open
        except (ConnectionResetError, socket.timeout):
            pass
        return out.decode("latin-1")


def test_silent_clients_do_not_delay_others(server):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    silent = []
    try:
        for _ in range(64):
            c = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            c.sendall(head)  # and never the body
            silent.append(c)
        time.sleep(0.2)
        start = time.monotonic()
        status, body = post(server.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0})
        took = time.monotonic() - start
        assert status == 200, body
        assert took < 1.5, f"a request behind 64 silent connections took {took:.1f} s"
    finally:
        for c in silent:
            c.close()


@pytest.mark.parametrize("length, status, says", [
    (10**12, 413, "The request body is larger than 1048576 bytes (Content-Length: 1000000000000)"),
    (-5, 400, 'Content-Length: expected a decimal byte count, got \\"-5\\"'),
    ("12x", 400, 'Content-Length: expected a decimal byte count, got \\"12x\\"'),
])
def test_content_length_is_checked_before_the_body(server, length, status, says):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()
    start = time.monotonic()
    reply = raw(server.port, head + b"{")
    took = time.monotonic() - start
    assert reply.startswith(f"HTTP/1.1 {status}"), reply[:300]
    assert says in reply, reply[:500]
    assert took < 1.0, f"answered after {took:.1f} s"
    assert get(server.url + "/health") == 200
