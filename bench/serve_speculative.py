#!/usr/bin/env python3
"""Speculative decoding inside `mhsa serve`: the default model (SmolLM2-135M-Instruct) served twice,
with prompt lookup (the default for greedy requests) and with `--draft 0`, on the five
input-grounded prompts of bench/speculative.py (quote, summarise, spelling, replace, list), in
paired rounds (the servers alternate: with lookup first in odd rounds).

- 1 client: each prompt in turn, streamed; its decode rate (completion tokens after the first /
  the time from the first text to the last) and its tokens and guesses;
- N clients (8 by default): N requests at once (the prompts in turn), the aggregate rate
  (completion tokens of all / the wall time from sending to the last answer).

Greedy, --tokens tokens at most, `mhsa serve -t THREADS --parallel N` with its defaults otherwise.
The greedy answers of both servers must be equal alone (the script asserts it).

  python3 bench/serve_speculative.py [--rounds 3] [--tokens 128] [--clients 8] [--threads 2] [--dtype q8_0]
      [--prompts quote,summarise,spelling,replace,list]
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from speculative import prompts  # noqa: E402


class Server:
    def __init__(self, *args):
        self.proc = subprocess.Popen([str(ROOT / "build" / "mhsa"), "serve", "--port", "0", "--log-requests", "off",
                                      *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if not m:
            raise RuntimeError(f"mhsa serve did not start: {line!r}")
        self.url = m.group(1)

    def metrics(self):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        return {k: float(v) for k, v in re.findall(r"^(mhsa_[a-z_]+) ([-\d.e+]+)$", text, re.M)}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def stream(url, prompt, tokens):
    """One streamed greedy chat request: (text, completion tokens, seconds from the first text to the end, wall)."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    text, count = "", 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                piece = c["delta"].get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
    end = time.perf_counter()
    return text, count, end - (first or end), end - t0


def one_client(server, texts, tokens):
    out = {}
    for name, prompt in texts.items():
        before = server.metrics()
        text, count, decode_s, _ = stream(server.url, prompt, tokens)
        after = server.metrics()
        guesses = after["mhsa_speculative_guesses_total"] - before["mhsa_speculative_guesses_total"]
        kept = after["mhsa_speculative_guesses_accepted_total"] - before["mhsa_speculative_guesses_accepted_total"]
        out[name] = {"text": text, "tokens": count, "rate": (count - 1) / decode_s if decode_s > 0 else 0.0,
                     "kept": kept / guesses if guesses else None}
    return out


def many_clients(server, texts, tokens, clients):
    prompts_ = [list(texts.values())[i % len(texts)] for i in range(clients)]
    before = server.metrics()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: stream(server.url, p, tokens), prompts_))
    wall = time.perf_counter() - t0
    after = server.metrics()
    d = {k: after[k] - before[k] for k in ("mhsa_speculative_guesses_total", "mhsa_speculative_guesses_accepted_total",
                                           "mhsa_scheduler_steps_total", "mhsa_scheduler_rows_total")}
    return {"aggregate": sum(r[1] for r in results) / wall, "guesses": d["mhsa_speculative_guesses_total"],
            "kept": d["mhsa_speculative_guesses_accepted_total"],
            "rows_per_step": d["mhsa_scheduler_rows_total"] / max(1, d["mhsa_scheduler_steps_total"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("--prompts", default="quote,summarise,spelling,replace,list", help="which of the five, by name")
    a = ap.parse_args()
    texts = {k: v for k, v in prompts()[0].items() if k in a.prompts.split(",")}
    common = ("--model", "smollm2", "--dtype", a.dtype, "-t", a.threads, "--parallel", a.clients, "--ctx-size", 2048,
              "--prompt-cache-ram", 0, "--no-prefix-sharing")
    servers = {"lookup": Server(*common), "plain": Server(*common, "--draft", 0)}
    single = {k: [] for k in servers}
    multi = {k: [] for k in servers}
    try:
        for r in range(a.rounds):
            order = ["lookup", "plain"] if r % 2 == 0 else ["plain", "lookup"]
            for k in order:
                single[k].append(one_client(servers[k], texts, a.tokens))
            for name in texts:
                assert single["lookup"][-1][name]["text"] == single["plain"][-1][name]["text"], name
            for k in order:
                multi[k].append(many_clients(servers[k], texts, a.tokens, a.clients))
            print(f"round {r + 1}: " + ", ".join(f"{k} {multi[k][-1]['aggregate']:.1f} t/s x{a.clients}" for k in order),
                  file=sys.stderr)
    finally:
        for s in servers.values():
            s.stop()
    med = statistics.median
    print(f"1 client, {a.dtype}, {a.threads} threads, {a.tokens} tokens, {a.rounds} paired rounds (medians):\n")
    print("| prompt | tokens | plain t/s | lookup t/s | guesses kept | lookup / plain (min-max) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in texts:
        ratios = [single["lookup"][r][name]["rate"] / single["plain"][r][name]["rate"] for r in range(a.rounds)]
        kept = [x[name]["kept"] for x in single["lookup"] if x[name]["kept"] is not None]
        print(f"| {name} | {single['plain'][0][name]['tokens']} | {med(x[name]['rate'] for x in single['plain']):.1f} | "
              f"{med(x[name]['rate'] for x in single['lookup']):.1f} | {f'{med(kept):.0%}' if kept else '-'} | "
              f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
    ratios = [multi["lookup"][r]["aggregate"] / multi["plain"][r]["aggregate"] for r in range(a.rounds)]
    print(f"\n{a.clients} clients at once, aggregate t/s (medians):\n")
    print("| plain | lookup | lookup / plain (min-max) | guesses checked | kept | rows per step, plain / lookup |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {med(x['aggregate'] for x in multi['plain']):.1f} | {med(x['aggregate'] for x in multi['lookup']):.1f} | "
          f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {med(x['guesses'] for x in multi['lookup']):.0f} | "
          f"{med(x['kept'] for x in multi['lookup']):.0f} | {med(x['rows_per_step'] for x in multi['plain']):.2f} / "
          f"{med(x['rows_per_step'] for x in multi['lookup']):.2f} |")


if __name__ == "__main__":
    main()
