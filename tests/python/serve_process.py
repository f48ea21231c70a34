"""`mhsa serve` as a subprocess, shared by the server tests (not a test module).

The server's stderr (its access log among it) goes to a file, never to a pipe nobody reads: a
long test would otherwise block the server once the pipe's 64 KiB are full. The URL, port and
served id are read from the line it prints when ready."""

import json
import os
import re
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))


class Server:
    """`mhsa serve --model MODEL --port 0 ARGS...` with `threads` threads (one by default: the tests
    share two cores with the client, and a team of two waits at every barrier when oversubscribed)."""

    def __init__(self, model, *args, threads=1, env=None):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([str(CLI), "serve", "-t", str(threads), "--model", str(model), "--port", "0",
                                      *map(str, args)], stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.ready = line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://[\d.]+:(\d+))(?: \(model ([^,)]+))?", line)
        assert m, f"no URL in {line!r}; stderr: {self.stderr()}"
        self.url, self.port = m.group(1), int(m.group(2))
        self.id = m.group(3) or Path(model).name

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def client(self, api_key="unused", **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)

    def anthropic(self, api_key="unused"):
        import anthropic
        return anthropic.Anthropic(base_url=self.url, api_key=api_key, max_retries=0)

    def request(self, path, body=None, headers=None, method=None, timeout=60):
        """(status, headers, body bytes) of one request; body: a dict or list (sent as JSON) or bytes."""
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def metric(self, name):
        _, _, text = self.request("/metrics")
        return float(re.search(rf"^{name} (\S+)$", text.decode(), re.M).group(1))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)
