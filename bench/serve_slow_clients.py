"""How long a normal request to `mhsa serve` waits behind idle or slow connections, and how long a
hostile Content-Length takes to be answered (issue 47's "request hygiene"). Not a load test: each
case opens its connections, times one request, and closes them.

    python3 bench/serve_slow_clients.py [--cli build/mhsa] [--model DIR] [--idle 64 300]

Cases: N connections that send nothing; N that send their headers and never the body; N that
trickle their headers one byte every 0.5 s (slowloris); then a Content-Length of 10^12, -5 and
"12x" on a fresh connection (the time to the answer and to the connection's close). Without
--model a tiny random GPT-2 is written to a temporary directory (tests/python/cli_models.py)."""

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start(cli, model):
    proc = subprocess.Popen([str(cli), "serve", "-t", "1", "--model", str(model), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on http://[\d.]+:(\d+)", line)
    if not m:
        raise SystemExit(f"serve_slow_clients: the server did not start: {line!r}")
    return proc, int(m.group(1))


def timed_request(port):
    body = json.dumps({"prompt": "Hello", "max_tokens": 2, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
    return time.monotonic() - start


def behind(port, n, kind):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    conns, stop = [], threading.Event()
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port), timeout=60)
        if kind == "headers":
            c.sendall(head)
        conns.append(c)

    def trickle():  # one byte of the headers every 0.5 s on each connection
        i = 0
        while not stop.is_set() and i < len(head):
            for c in conns:
                try:
                    c.send(head[i:i + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(0.5)

    t = threading.Thread(target=trickle) if kind == "trickle" else None
    if t:
        t.start()
    time.sleep(0.3)
    took = timed_request(port)
    stop.set()
    if t:
        t.join()
    for c in conns:
        c.close()
    return took


def content_length(port, length):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n{{").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        start = time.monotonic()
        c.sendall(head)
        out, answered = b"", None
        while chunk := c.recv(65536):
            out += chunk
            if answered is None and b"\r\n\r\n" in out:
                answered = time.monotonic() - start
        closed = time.monotonic() - start
    return out.split(b"\r\n", 1)[0].decode(), answered, closed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=str(ROOT / "build" / "mhsa"))
    ap.add_argument("--model")
    ap.add_argument("--idle", type=int, nargs="+", default=[64, 300])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if not model:
            sys.path.insert(0, str(ROOT / "tests" / "python"))
            from cli_models import write_gpt2_dir
            model = write_gpt2_dir(Path(tmp), seed=7)
        proc, port = start(a.cli, model)
        try:
            print(f"alone: {timed_request(port):.3f} s")
            for n in a.idle:
                for kind in ("silent", "headers", "trickle"):
                    print(f"behind {n} {kind} connections: {behind(port, n, kind):.3f} s", flush=True)
                    time.sleep(0.5)
            for length in (10**12, -5, "12x"):
                status, answered, closed = content_length(port, length)
                answered = "never" if answered is None else f"{answered:.3f} s"
                print(f"Content-Length {length}: {status!r} after {answered}, closed after {closed:.3f} s", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
