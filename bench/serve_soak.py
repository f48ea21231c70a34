#!/usr/bin/env python3
"""A soak of `mhsa serve`: many requests from concurrent clients, some of which leave mid-answer,
then checks that nothing was lost, duplicated or leaked.

Each request is one of: a non-streaming completion, a streaming completion read to the end, or a
streaming completion whose client closes the connection after a random number of events (a
disconnect). Prompts come from a small set, all greedy, so every answer that finishes can be
compared with the first answer to the same prompt and max_tokens: batching with whatever else is
running must not change a token. The checks, printed and turned into the exit status:
- every request that was not cut off got exactly one well-formed answer (a finish_reason, usage
  whose completion_tokens is at most max_tokens, and for streams one [DONE]);
- equal requests got equal texts;
- the server counted exactly the requests sent (mhsa_requests_total for /v1/completions, status
  200) and no more cancellations than disconnects;
- afterwards no sequence is active or queued (mhsa_batch_size, mhsa_queue_length), and every KV
  block is back in the pool (mhsa_kv_blocks_used and _reserved 0); half the prompts begin with one
  shared "system prompt", whose blocks must have been shared (mhsa_prefix_cache_hits_total > 0);
- the server's resident memory after the soak is within --rss-slack MB of what it was after a
  warm-up of the same requests (freed KV caches are given back or reused, not leaked).

Usage: python3 bench/serve_soak.py [--model DIR] [--requests 1000] [--clients 8] [--max-tokens 24]
       [--disconnect 0.2] [--threads 1] [--seed N] [--cli build/mhsa]
Without --model, a small random GPT-2 (2 layers, C 128) is written to a temporary directory with
transformers. Progress is printed every 100 requests.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the cat sat on a mat while rain fell over quiet hills and old ships sailed toward a far bright "
         "harbour where children sang").split()


def tiny_gpt2(directory: Path) -> Path:
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=256, vocab_size=50257)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # a livelier random model: varied tokens, so answers differ by prompt
        model.transformer.wte.weight.mul_(20.0)
    model.save_pretrained(directory)
    tokenizer = ROOT / "tests" / "data" / "gpt2-tokenizer"
    (directory / "vocab.json").write_bytes((tokenizer / "encoder.json").read_bytes())
    (directory / "merges.txt").write_bytes((tokenizer / "vocab.bpe").read_bytes())
    return directory


class Server:
    def __init__(self, cli, model, parallel, queue, threads):
        self.proc = subprocess.Popen([str(cli), "serve", "-t", str(threads), "--model", str(model), "--port", "0", "--parallel",
                                      str(parallel), "--queue", str(queue)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if not m:
            raise SystemExit(f"serve did not start: {line!r} {self.proc.stderr.read()}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.model = Path(model).name

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.host}:{self.port}/metrics", timeout=30) as r:
            return r.read().decode()

    def metric(self, pattern: str) -> float:
        m = re.search(rf"^{pattern} (\S+)$", self.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def one_request(server, kind, prompt, max_tokens, cut_after):
    """Returns (kind, key, text or None, problem or None)."""
    body = json.dumps(dict(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                           stream=kind != "whole")).encode()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=300)
    key = (prompt, max_tokens)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return kind, key, None, f"status {resp.status}: {resp.read()[:200]!r}"
        if kind == "whole":
            data = json.loads(resp.read())
            choice = data["choices"][0]
            used = data["usage"]["completion_tokens"]
            if choice.get("finish_reason") not in ("stop", "length") or not 0 <= used <= max_tokens:
                return kind, key, None, f"bad answer {data}"
            return kind, key, choice["text"], None
        text, events, done, finish = [], 0, 0, None
        while True:
            line = resp.readline()  # chunked transfer decoded: ends at the last chunk, not at the socket
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done += 1
                continue
            event = json.loads(payload)
            events += 1
            choice = event["choices"][0]
            text.append(choice.get("text", ""))
            finish = choice.get("finish_reason") or finish
            if kind == "cut" and events >= cut_after:
                return kind, key, None, None  # the client leaves (the connection closes below)
        if done != 1 or finish not in ("stop", "length"):
            return kind, key, None, f"stream ended with {done} [DONE] and finish {finish!r}"
        return kind, key, "".join(text), None
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return kind, key, None, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def soak(server, n, clients, max_tokens, disconnect, rng, label):
    jobs = []
    system = " ".join(rng.choice(WORDS) for _ in range(40))  # half the prompts begin with it: shared KV blocks
    prompts = [(system + " " if i % 2 else "") + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
               for i in range(16)]
    for _ in range(n):
        r = rng.random()
        kind = "cut" if r < disconnect else "whole" if r < (1 + disconnect) / 2 else "stream"
        jobs.append((kind, rng.choice(prompts), rng.choice((1, max_tokens // 2, max_tokens)), rng.randint(1, 4)))
    results, lock, t0 = [], threading.Lock(), time.time()

    def run(job):
        out = one_request(server, *job)
        with lock:
            results.append(out)
            if len(results) % 100 == 0:
                print(f"  {label}: {len(results)}/{n} requests, {time.time() - t0:.0f} s", flush=True)
        return out

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, jobs))
    return results, prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--cli", default=str(ROOT / "build" / "mhsa"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--disconnect", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=1, help="serve -t (1: immune to a busy host's preemption)")
    ap.add_argument("--rss-slack", type=float, default=32.0, help="MB the RSS may grow over the soak")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    args = ap.parse_args()
    print(f"seed {args.seed}", flush=True)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else tiny_gpt2(Path(tmp) / "tiny-gpt2")
        server = Server(args.cli, model, parallel=args.clients, queue=4 * args.clients, threads=args.threads)
        problems = []
        try:
            warm, _ = soak(server, min(args.requests, 100), args.clients, args.max_tokens, args.disconnect, rng, "warm-up")
            time.sleep(0.5)
            rss0, sent0 = server.rss_mb(), server.metric(r'mhsa_requests_total\{path="/v1/completions",status="200"\}')
            cancelled0 = server.metric("mhsa_requests_cancelled_total")
            results, _ = soak(server, args.requests, args.clients, args.max_tokens, args.disconnect, rng, "soak")
            for _ in range(200):  # cancelled sequences leave at the scheduler's next step
                if server.metric("mhsa_batch_size") == 0 and server.metric("mhsa_queue_length") == 0:
                    break
                time.sleep(0.05)
            rss1 = server.rss_mb()
            sent = server.metric(r'mhsa_requests_total\{path="/v1/completions",status="200"\}') - sent0
            cancelled = server.metric("mhsa_requests_cancelled_total") - cancelled0
            active, queued = server.metric("mhsa_batch_size"), server.metric("mhsa_queue_length")
            kv = {k: server.metric(f"mhsa_kv_blocks_{k}") for k in ("total", "used", "free", "cached", "reserved")}
            hits, hit_tokens = server.metric("mhsa_prefix_cache_hits_total"), server.metric("mhsa_prefix_cache_tokens_total")
        finally:
            code = server.stop()
    texts = {}
    for kind, key, text, problem in warm + results:
        if problem:
            problems.append(f"{kind} {key}: {problem}")
        elif text is not None:
            texts.setdefault(key, set()).add(text)
    for key, seen in texts.items():
        if len(seen) != 1:
            problems.append(f"{key}: {len(seen)} different greedy texts: {sorted(seen)[:2]}")
    cuts = sum(kind == "cut" for kind, *_ in results)
    print(f"requests {len(results)} ({cuts} cut off), answered with status 200: {sent:.0f}, cancelled {cancelled:.0f}, "
          f"distinct (prompt, max_tokens) pairs {len(texts)}")
    print(f"after: active {active:.0f}, queued {queued:.0f}; RSS {rss0:.1f} MB after warm-up, {rss1:.1f} MB after "
          f"the soak; serve exited {code}")
    print(f"KV blocks after: {kv['used']:.0f} used, {kv['reserved']:.0f} promised, {kv['free']:.0f} free "
          f"({kv['cached']:.0f} of them cached prefixes) of {kv['total']:.0f}; prefix hits {hits:.0f} requests, "
          f"{hit_tokens:.0f} prompt tokens not prefilled")
    if kv["used"] or kv["reserved"] or kv["free"] != kv["total"] or not kv["total"]:
        problems.append(f"KV blocks not all returned: {kv}")
    if not hits:
        problems.append("no request shared the system prompt's KV blocks")
    if sent != len(results):
        problems.append(f"the server answered {sent:.0f} requests with 200, {len(results)} were sent")
    if cancelled > cuts:
        problems.append(f"{cancelled:.0f} cancellations for {cuts} disconnects")
    if active or queued:
        problems.append(f"{active:.0f} sequences still active, {queued:.0f} queued")
    if rss1 > rss0 + args.rss_slack:
        problems.append(f"RSS grew by {rss1 - rss0:.1f} MB (allowed {args.rss_slack})")
    if code != 0:
        problems.append(f"serve exited {code} on SIGTERM")
    for p in problems[:20]:
        print("PROBLEM:", p)
    print("soak ok" if not problems else f"soak FAILED: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
