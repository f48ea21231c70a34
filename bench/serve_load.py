#!/usr/bin/env python3
"""Load on `mhsa serve`: one streaming client, then N concurrent ones (8 by default), each asking
for a fixed number of greedy tokens (128) after a fixed prompt of its own, on GPT-2 124M's shape
with random weights (bench/random_hf_model.py). Prints per round the aggregate decode rate
(completion tokens of all clients / the round's wall time), each stream's own decode rate (after
its first token), time to first token p50/p99, and the ratio of the N-client aggregate to the
single stream's. Every request must return exactly its tokens (usage) and nothing else fails.

  serve_load.py [--model DIR] [--clients 8] [--tokens 128] [--rounds 3] [-t THREADS] [--parallel N] [--peer]
                [--dtype f32|f16|bf16|q8_0] [--system N] [--serve-args "..."] [--temperature T] [--top-p P]

--temperature and --top-p sample (greedy by default; the API's default is temperature 1), in
every request to either server.

--system N puts one "system prompt" of N words before every prompt (the KV blocks of a shared
prefix: compare with --serve-args=--no-prefix-sharing); --serve-args passes more options to serve.

Without --model, a random GPT-2 124M is written once to build/serve-load-gpt2 (transformers'
save_pretrained, ~500 MB). The clients are plain http.client threads reading server-sent events;
on a small machine they share the CPU with the server, so run it on an otherwise quiet host.
Not a test: it passes or fails nothing but a request that errs.

--dtype serves the weights in that type (`mhsa serve --dtype`). --peer runs the same load against
llama.cpp's llama-server in the same run: both servers load the GGUF that llama.cpp's
convert_hf_to_gguf.py makes of the model directory with `--outtype` the --dtype (F32 by default;
built and converted by bench/llama_cpp_peer.sh on first use), mhsa keeping its tensors in
--dtype, llama-server with `-np PARALLEL -t THREADS -c PARALLEL*256` and its defaults otherwise
(F16 KV cache, flash attention auto); every request to it says cache_prompt false, since the rounds
repeat their prompts (mhsa's prefix sharing and prompt cache keep whole 16-token blocks only, which
these prompts do not fill).
The engines alternate, round by round (mhsa first in odd rounds, llama-server in even ones); the
summary gives each one's medians, TTFT p50/p99, and the median (min-max) of the paired ratios.
"""

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The history of the city begins in",
    "In a small village by the sea, there lived",
    "Scientists announced on Tuesday that",
    "The recipe calls for two cups of flour and",
    "When the train finally arrived at the station,",
    "Chapter one. It was a cold morning in",
    "The main advantage of this approach is that",
    "According to the latest report, the company",
]


def ensure_model(path):
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "random_hf_model.py"), "--arch", "gpt2", str(path)],
                       check=True)
    return path


def start_server(cli, model, threads, parallel, extra=()):
    proc = subprocess.Popen([str(cli), "serve", "--model", str(model), "--port", "0", "-t", str(threads),
                             "--parallel", str(parallel), "--queue", "64", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on http://([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"serve_load: the server did not start: {line!r} {proc.stderr.read()}")
    return proc, m.group(1), int(m.group(2))


def start_peer(model, threads, parallel, outtype="f32"):
    """llama-server on the GGUF llama.cpp's converter makes of `model` (--outtype `outtype`);
    (process, host, port, gguf)."""
    env = dict(os.environ, MHSA_PEER_TARGETS="llama-server", MHSA_PEER_NO_BENCH="1", MHSA_PEER_HF_DIR=str(model),
               MHSA_PEER_OUTTYPE=outtype)
    out = subprocess.run(["bash", str(ROOT / "bench" / "llama_cpp_peer.sh")], check=True, env=env,
                         capture_output=True, text=True)
    peer = json.loads(out.stdout.strip().splitlines()[-1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(ROOT / "build" / "serve-load-llama-server.log", "w")  # its log is long: not a pipe
    proc = subprocess.Popen([str(Path(peer["bin_dir"]) / "llama-server"), "-m", peer["gguf"], "--host", "127.0.0.1",
                             "--port", str(port), "-t", str(threads), "-np", str(parallel), "-c", str(parallel * 256),
                             "--no-webui"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve_load: llama-server exited ({proc.returncode}); see {log.name}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, "127.0.0.1", port, peer
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("serve_load: llama-server did not become ready in 120 s")


def stream_completion(host, port, prompt, tokens, extra=None):
    """(time to first text, time of the last text, completion tokens, seconds in all) of one streamed request."""
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, **(extra or {})})
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    first = last = None
    usage = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            now = time.perf_counter()
            first = first if first is not None else now - t0
            last = now - t0
    conn.close()
    total = time.perf_counter() - t0
    if usage is None or first is None:
        raise RuntimeError("a stream without text or usage")
    return first, last, usage["completion_tokens"], total


def run_round(host, port, clients, tokens, extra=None, system=""):
    results, errors = [None] * clients, []

    def client(i):
        try:
            results[i] = stream_completion(host, port, system + PROMPTS[i % len(PROMPTS)], tokens, extra)
        except Exception as e:  # noqa: BLE001 — reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"serve_load: {len(errors)} requests failed: {errors[0]}")
    generated = sum(r[2] for r in results)
    per_stream = [(r[2] - 1) / (r[1] - r[0]) for r in results if r[2] > 1 and r[1] > r[0]]
    ttft = sorted(r[0] for r in results)
    return {"clients": clients, "tokens": generated, "wall_s": wall, "aggregate_tok_s": generated / wall,
            "stream_tok_s": statistics.median(per_stream) if per_stream else 0.0, "ttft": ttft}


def percentile(sorted_values, q):
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def metrics(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {k: float(v) for k, v in re.findall(r"^(mhsa_scheduler_\w+_total) (\S+)$", text, re.M)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a model directory (default: a random GPT-2 124M)")
    ap.add_argument("--cli", type=Path, default=ROOT / "build" / "mhsa")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (1 client, N clients), alternating")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, help="the server's --parallel (default: --clients)")
    ap.add_argument("--peer", action="store_true", help="the same load on llama.cpp's llama-server, alternating")
    ap.add_argument("--system", type=int, default=0, help="words of a system prompt shared by every prompt")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16", "q8_0"), default="f32",
                    help="mhsa serve --dtype (and with --peer, the GGUF's type for both servers)")
    ap.add_argument("--serve-args", default="", help="more options for mhsa serve (split at spaces)")
    ap.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (0: greedy)")
    ap.add_argument("--top-p", type=float, help="every request's top_p (default: the server's, 1)")
    a = ap.parse_args()
    sampling = {"temperature": a.temperature, **({"top_p": a.top_p} if a.top_p is not None else {})}
    words = "You are a helpful assistant who answers every question about the world briefly and well".split()
    system = " ".join(words[i % len(words)] for i in range(a.system)) + "\n" if a.system else ""
    model = a.model or ensure_model(ROOT / "build" / "serve-load-gpt2")
    parallel = a.parallel or a.clients
    engines = []  # (name, process, host, port, extra request fields)
    try:
        if a.peer:
            proc, host, port, peer = start_peer(model, a.threads, parallel, a.dtype)
            engines.append(("llama-server", proc, host, port, {"cache_prompt": False, **sampling}))
            print(f"peer: {peer['llama_cpp_version']}, llama-server -np {parallel} -t {a.threads} on {peer['gguf']}; "
                  f"mhsa serves the same file", flush=True)
            served = Path(peer["gguf"])
        else:
            served = model
        dtype = ["--dtype", a.dtype] if a.dtype != "f32" else []
        proc, host, port = start_server(a.cli, served, a.threads, parallel, dtype + a.serve_args.split())
        engines.insert(0, ("mhsa", proc, host, port, sampling))
        stats = {name: {"single": [], "multi": [], "ttft1": [], "ttftn": []} for name, *_ in engines}
        for _, _, host, port, extra in engines:
            run_round(host, port, 1, 8, extra)  # warm-up: weights paged in, buffers allocated
        for k in range(a.rounds):
            order = engines if k % 2 == 0 else engines[::-1]
            for name, _, host, port, extra in order:
                st = stats[name]
                one = run_round(host, port, 1, a.tokens, extra, system)
                before = metrics(host, port) if name == "mhsa" else None
                many = run_round(host, port, a.clients, a.tokens, extra, system)
                per_step = ""
                if before is not None:
                    after = metrics(host, port)
                    # (an older server has no sequences counter: the mean then reads 0)
                    steps = after["mhsa_scheduler_steps_total"] - before["mhsa_scheduler_steps_total"]
                    seqs = after.get("mhsa_scheduler_sequences_total", 0) - before.get("mhsa_scheduler_sequences_total", 0)
                    busy = after.get("mhsa_scheduler_busy_seconds_total", 0) - before.get("mhsa_scheduler_busy_seconds_total", 0)
                    per_step = f"; {seqs / max(steps, 1):.2f} sequences per step, {busy / max(steps, 1) * 1e3:.1f} ms a step"
                st["single"].append(one["aggregate_tok_s"])
                st["multi"].append(many["aggregate_tok_s"])
                st["ttft1"] += one["ttft"]
                st["ttftn"] += many["ttft"]
                print(f"round {k + 1} {name}: 1 client {one['aggregate_tok_s']:.1f} tok/s ({one['tokens']} tokens, "
                      f"TTFT {one['ttft'][0] * 1e3:.0f} ms); {a.clients} clients {many['aggregate_tok_s']:.1f} tok/s "
                      f"aggregate ({many['tokens']} tokens in {many['wall_s']:.2f} s, each stream "
                      f"{many['stream_tok_s']:.1f} tok/s), ratio {many['aggregate_tok_s'] / one['aggregate_tok_s']:.2f}"
                      f"{per_step}", flush=True)
        for name, *_ in engines:
            st = stats[name]
            st["ttft1"].sort()
            st["ttftn"].sort()
            ratios = [m / s for m, s in zip(st["multi"], st["single"])]
            print(f"summary {name} ({a.rounds} rounds, -t {a.threads}, {a.dtype}, temperature {a.temperature}"
                  f"{'' if a.top_p is None else f', top_p {a.top_p}'}, GPT-2 shape {model.name}): "
                  f"1 client median {statistics.median(st['single']):.1f} tok/s; {a.clients} clients median "
                  f"{statistics.median(st['multi']):.1f} tok/s aggregate; ratio median {statistics.median(ratios):.2f} "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f}); TTFT 1 client p50 "
                  f"{percentile(st['ttft1'], 0.5) * 1e3:.0f} ms, {a.clients} clients p50 "
                  f"{percentile(st['ttftn'], 0.5) * 1e3:.0f} ms p99 {percentile(st['ttftn'], 0.99) * 1e3:.0f} ms",
                  flush=True)
        if a.peer:
            ours, theirs = stats["mhsa"], stats["llama-server"]
            paired = [m / p for m, p in zip(ours["multi"], theirs["multi"])]
            single = [m / p for m, p in zip(ours["single"], theirs["single"])]
            print(f"mhsa / llama-server, {a.clients} clients aggregate: median {statistics.median(paired):.2f} "
                  f"(min {min(paired):.2f}, max {max(paired):.2f}) over {a.rounds} paired rounds; 1 client: median "
                  f"{statistics.median(single):.2f}; TTFT p50 with {a.clients} clients: "
                  f"{percentile(ours['ttftn'], 0.5) * 1e3:.0f} ms vs {percentile(theirs['ttftn'], 0.5) * 1e3:.0f} ms")
    finally:
        for _, proc, *_ in engines:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
