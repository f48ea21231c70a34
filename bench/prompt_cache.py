#!/usr/bin/env python3
"""Time to first token of a long prompt after a restart of `mhsa serve` with --cache-dir, against a
cold prefill of the same prompt. Each round: start a server on an empty cache directory, send a
prompt of about --tokens tokens (its first words differ from round to round, so nothing of it is
cached), stream the answer and time its first text (cold); stop the server (SIGTERM: the blocks are
on disk when it exits), start a new one on the same directory, send the same prompt again (warm:
its blocks read back from the files). Prints each round's times and their ratio, the medians, and
checks that the greedy answers are the same.

  prompt_cache.py [--model smollm2] [--tokens 2000] [--rounds 5] [-t THREADS] [--cli PATH] [--serve-args "..."]

Before each measurement it waits (up to --wait seconds) until the CPUs have been at least 90% idle for 3
seconds in a row (/proc/stat), since a prefill that shares 2 cores with another process's threads
slows 5–15× (OpenMP's barriers): other engineers' builds and benchmarks share this machine.

The files are read back from the page cache (the server that wrote them ran seconds before): the
restart is a process's, not the machine's. The prompt is the text of docs/architecture.md, cut to
--tokens as the server counts them. Run it on an otherwise quiet host (`uptime` is printed before
and after); not a test: it passes or fails nothing but a request that errs or answers that differ.
"""

import argparse
import http.client
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def idle_fraction(seconds=1.0):
    """The share of CPU time spent idle over the next `seconds` (all CPUs)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return (i1 - i0) / max(1, t1 - t0)


def wait_for_idle(limit):
    start, quiet = time.monotonic(), 0
    while quiet < 3 and time.monotonic() - start < limit:
        quiet = quiet + 1 if idle_fraction() >= 0.9 else 0
    waited = time.monotonic() - start
    if quiet < 3:
        print(f"(the CPUs were not idle after {waited:.0f} s: measuring anyway)", flush=True)
    elif waited > 4:
        print(f"(waited {waited:.0f} s for idle CPUs)", flush=True)


def start(cli, model, threads, cache_dir, extra):
    proc = subprocess.Popen([str(cli), "serve", "--model", model, "--port", "0", "-t", str(threads), "--parallel", "1",
                             "--cache-dir", str(cache_dir), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on http://([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"prompt_cache: the server did not start: {line!r} {proc.stderr.read()}")
    return proc, m.group(1), int(m.group(2))


def stop(proc):
    proc.send_signal(2)
    if proc.wait(timeout=120) != 0:
        raise SystemExit(f"prompt_cache: the server exited with {proc.returncode}: {proc.stderr.read()}")


def request(host, port, prompt, max_tokens, stream):
    """(seconds to the first text, the whole text, usage) of one greedy completion."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise SystemExit(f"prompt_cache: HTTP {r.status}: {r.read()[:500]!r}")
    if not stream:
        j = json.loads(r.read())
        return time.perf_counter() - t0, j["choices"][0]["text"], j["usage"]
    first, text, usage = None, "", None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            if c.get("text"):
                if first is None:
                    first = time.perf_counter() - t0
                text += c["text"]
    conn.close()
    return first, text, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--cli", default=os.environ.get("MHSA_CLI", str(ROOT / "build" / "mhsa")))
    ap.add_argument("--serve-args", default="", help="more options for both servers")
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for idle CPUs before a round at most")
    a = ap.parse_args()
    extra = shlex.split(a.serve_args)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)

    words = (ROOT / "docs" / "architecture.md").read_text().split()
    cold_times, warm_times = [], []
    with tempfile.TemporaryDirectory(prefix="mhsa-prompt-cache-") as tmp:
        # The prompt's length in the model's tokens: words added until the server counts --tokens.
        proc, host, port = start(a.cli, a.model, a.threads, Path(tmp) / "calibrate", extra + ["--prompt-cache-ram", "0"])
        try:
            n = a.tokens // 2
            for _ in range(8):
                got = request(host, port, " ".join(words[:n]), 1, False)[2]["prompt_tokens"]
                if abs(got - a.tokens) <= a.tokens // 100:
                    break
                n = max(1, int(n * a.tokens / got))
        finally:
            stop(proc)
        base = " ".join(words[:n])
        for r in range(a.rounds):
            prompt = f"Round {r} of {time.time_ns()}: {base}"
            d = Path(tmp) / f"round{r}"
            wait_for_idle(a.wait)
            proc, host, port = start(a.cli, a.model, a.threads, d, extra)
            try:
                cold, cold_text, usage = request(host, port, prompt, a.max_tokens, True)
            finally:
                stop(proc)
            files = list(d.glob("*.kvc"))
            wait_for_idle(a.wait)
            proc, host, port = start(a.cli, a.model, a.threads, d, extra)
            try:
                warm, warm_text, warm_usage = request(host, port, prompt, a.max_tokens, True)
            finally:
                stop(proc)
            if warm_text != cold_text:
                raise SystemExit(f"prompt_cache: round {r}: the answers differ: {cold_text!r} != {warm_text!r}")
            cached = (warm_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            cold_times.append(cold)
            warm_times.append(warm)
            print(f"round {r}: prompt {usage['prompt_tokens']} tokens, {len(files)} block files "
                  f"({sum(f.stat().st_size for f in files) / 2**20:.1f} MiB); TTFT cold {cold * 1e3:.0f} ms, "
                  f"after a restart {warm * 1e3:.0f} ms ({cached} tokens from the files): {warm / cold:.1%}", flush=True)
    cm, wm = statistics.median(cold_times), statistics.median(warm_times)
    print(f"median over {a.rounds} rounds: cold {cm * 1e3:.0f} ms, after a restart {wm * 1e3:.0f} ms: {wm / cm:.1%} "
          f"(per round {min(w / c for w, c in zip(warm_times, cold_times)):.1%}–"
          f"{max(w / c for w, c in zip(warm_times, cold_times)):.1%}); answers identical")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    sys.exit(main())
