"""The web chat of `mhsa serve` at / and its attention view, on the real default model (SmolLM2-135M-Instruct):

- headless Chromium (Debian's, through Playwright) against a real server: the page loads from the
  binary with a strict Content-Security-Policy and no console errors; a message's answer streams in
  (its text seen growing); the system prompt and sampling settings go into the request; Stop ends an
  answer mid-way and the server cancels it; Regenerate replaces the last answer; the attention view
  shows every layer × head for the exchange's tokens and what a picked token attended to; markdown
  renders (code block, bold, inline code, list, a safe link) while <script>, an onerror attribute and
  a javascript: link in stored messages stay text and never run; conversations are kept, listed,
  created and deleted in localStorage;
- POST /v1/explain gives bit for bit the probabilities of `mhsa explain --messages --json` on the
  same conversation, the same ids and roles; hostile bodies are 400s naming the field, and the server
  keeps serving; an unknown path is still a JSON 404; with --api-key the page loads without the key
  and every API call needs it.

MHSA_REQUIRE_BROWSER=1 (scripts/test.sh) makes a missing Playwright or Chromium a failure, not a
skip. MHSA_WEB_CHAT_SCREENSHOTS=DIR writes the docs' screenshots there
(scripts/web_chat_screenshots.sh).
"""

import base64
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from serve_process import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHROMIUM = Path("/usr/bin/chromium")
LAYERS, HEADS = 30, 9  # SmolLM2-135M
CONVERSATION = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is Paris."}]


@pytest.fixture(scope="module")
def server():
    s = Server("smollm2", "--parallel", "2", "--ctx-size", "2048")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    # CI (scripts/test.sh sets MHSA_REQUIRE_BROWSER=1) must run these; elsewhere a missing browser skips.
    required = os.environ.get("MHSA_REQUIRE_BROWSER") == "1"
    if required:
        from playwright import sync_api
    else:
        sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        if required:
            pytest.fail(f"{CHROMIUM} is not installed (scripts/setup.sh --test installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} is not installed (scripts/setup.sh --test installs Debian's chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")  # fresh: no conversations from another run
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"],
            viewport={"width": 1280, "height": 860})
        yield context
        context.close()


def screenshot(page, name):
    out = os.environ.get("MHSA_WEB_CHAT_SCREENSHOTS")
    if out:
        page.screenshot(path=str(Path(out) / name))


def probabilities(explanation):
    """The endpoint's attention as [layer][head] lists of lower triangles (float32)."""
    flat = np.frombuffer(base64.b64decode(explanation["attention"]), dtype="<f4")
    T = len(explanation["ids"])
    tri = T * (T + 1) // 2
    assert flat.size == explanation["layers"] * explanation["heads"] * tri
    return flat.reshape(explanation["layers"], explanation["heads"], tri)


# ---- the endpoint ------------------------------------------------------------------------------

def test_explain_equals_the_command(server, tmp_path):
    status, headers, body = server.request("/v1/explain", {"messages": CONVERSATION})
    assert status == 200 and headers["Content-Type"] == "application/json", body[:300]
    got = json.loads(body)
    (tmp_path / "m.json").write_text(json.dumps(CONVERSATION))
    subprocess.run([str(CLI), "explain", "-t", "1", "--model", "smollm2", "--messages", str(tmp_path / "m.json"),
                    "--json", str(tmp_path / "e.json")], check=True, capture_output=True, text=True)
    want = json.loads((tmp_path / "e.json").read_text())
    assert got["ids"] == want["ids"] and got["roles"] == want["roles"]
    assert [r for i, r in enumerate(got["roles"]) if i == 0 or got["roles"][i - 1] != r] == ["system", "user", "assistant"]
    assert (got["layers"], got["heads"]) == (LAYERS, HEADS) == (len(want["attention"]), len(want["attention"][0][0]))
    assert (got["embed_dim"], got["head_dim"]) == (576, 64)
    T = len(got["ids"])
    rows, cols = np.tril_indices(T)
    exact = probabilities(got)
    for layer in range(LAYERS):
        # mhsa explain --json prints each float32 as the shortest text that reads back as it: bit for bit.
        full = np.asarray(want["attention"][layer][0], dtype=np.float64).astype(np.float32)  # [H, T, T]
        assert np.array_equal(exact[layer].view(np.uint32), full[:, rows, cols].view(np.uint32)), layer
    assert len(got["tokens"]) == len(got["labels"]) == T
    assert set(got["summaries"]) == {"entropy", "first_token", "previous_token", "self"}

    # Beside the scheduler's steps: the same bits while two answers are being generated.
    def generate():
        server.request("/v1/chat/completions", {"messages": CONVERSATION[:2], "max_tokens": 48, "temperature": 0.9,
                                                "stream": True})
    threads = [threading.Thread(target=generate) for _ in range(2)]
    for t in threads:
        t.start()
    while server.metric("mhsa_batch_size") == 0 and any(t.is_alive() for t in threads):
        time.sleep(0.02)
    status, _, body = server.request("/v1/explain", {"messages": CONVERSATION})
    busy = server.metric("mhsa_batch_size")
    for t in threads:
        t.join()
    assert status == 200 and json.loads(body)["attention"] == got["attention"]
    print(f"explained beside {busy:.0f} generating sequence(s)")


def test_explain_refuses_hostile_input(server):
    def error(body):
        status, _, text = server.request("/v1/explain", body)
        assert status == 400, (body, text)
        return json.loads(text)["error"]

    assert "body" in error(b"{not json")["message"]
    assert error([1, 2])["param"] == "body"
    assert error({})["param"] == "messages"
    assert error({"messages": []})["param"] == "messages"
    assert error({"messages": "hi"})["param"] == "messages"
    assert error({"messages": [{"role": "user", "content": "x"}] * 257})["param"] == "messages"
    assert error({"messages": [5]})["param"] == "messages[0]"
    assert error({"messages": [{"role": 1, "content": "x"}]})["param"] == "messages[0].role"
    assert error({"messages": [{"role": "r" * 65, "content": "x"}]})["param"] == "messages[0].role"
    assert error({"messages": [{"role": "user", "content": ["x"]}]})["param"] == "messages[0].content"
    assert error({"messages": [{"role": "user", "content": "x", "name": "n"}]})["param"] == "messages[0].name"
    assert error({"messages": CONVERSATION, "layer": 3})["param"] == "layer"
    e = error({"messages": [{"role": "user", "content": "word " * 3000}]})  # past the view's token bound
    assert e["param"] == "messages" and re.search(r"expected at most \d+ tokens \(the attention view's limit", e["message"]), e
    assert "nested" in error(b"[" * 100000)["message"]
    status, _, text = server.request("/v1/nowhere")
    assert status == 404 and "GET / (the web chat)" in json.loads(text)["error"]["message"]
    assert server.request("/health")[0] == 200


def test_api_key_guards_the_api_not_the_page(browser):
    s = Server("smollm2", "--api-key", "sesame", "--parallel", "1", "--ctx-size", "1024")
    try:
        status, headers, body = s.request("/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert s.request("/v1/explain", {"messages": CONVERSATION})[0] == 401
        assert s.request("/v1/explain", {"messages": CONVERSATION[:2]}, {"Authorization": "Bearer sesame"})[0] == 200
        # the page: a 401 from /v1/models asks for the key, which then goes with every request
        page = browser.new_page()
        page.goto(s.url + "/")
        page.wait_for_selector("#key-box", state="visible")
        assert "401" in page.inner_text("#error")
        page.fill("#api-key", "sesame")
        page.click("#key-save")
        wait_until(page, "document.getElementById('model-name').textContent.includes('context')")
        assert page.is_hidden("#key-box") and page.is_hidden("#error")
        page.close()
    finally:
        assert s.stop() == 0


# ---- the page in a browser ---------------------------------------------------------------------

def last_answer(page):
    return page.locator("#messages .msg.assistant .body").last


def wait_until(page, expression, timeout=60.0):
    """Polls a JavaScript expression from here: Playwright's wait_for_function evaluates its text with
    eval() inside the page, which the page's Content-Security-Policy refuses (as it should)."""
    deadline = time.time() + timeout
    while not page.evaluate(expression):
        assert time.time() < deadline, f"timed out waiting for {expression}"
        page.wait_for_timeout(50)


def wait_idle(page, timeout=60_000):
    page.wait_for_selector("#stop", state="hidden", timeout=timeout)


def test_page_in_a_browser(server, browser):
    page = browser.new_page()
    problems, chats = [], []
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: chats.append(json.loads(r.post_data)) if r.url.endswith("/v1/chat/completions") else None)
    response = page.goto(server.url + "/")
    assert response.status == 200 and response.headers["content-type"] == "text/html; charset=utf-8"
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/]+=*'; style-src 'sha256-", csp), csp
    wait_until(page, "document.getElementById('model-name').textContent.includes('context')")

    # settings: a system prompt, greedy, a short answer
    page.click("#settings summary")
    page.fill("#system", "You are a helpful assistant who answers briefly.")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "32")
    page.fill("#seed", "7")

    # send: the answer streams in, its text growing while the Stop button shows
    page.fill("#input", "Name three colours of the rainbow.")
    page.press("#input", "Enter")
    page.wait_for_selector("#stop", state="visible")
    lengths = []
    while page.is_visible("#stop") and len(lengths) < 2000:
        lengths.append(len(last_answer(page).inner_text()))
        page.wait_for_timeout(15)
    wait_idle(page)
    final = last_answer(page).inner_text()
    seen = sorted(set(n for n in lengths if n > 0))
    assert len(seen) >= 3 and final, (seen, final)  # at least three partial texts before the end
    body = chats[-1]
    assert body["stream"] is True and body["temperature"] == 0 and body["max_tokens"] == 32 and body["seed"] == 7
    assert body["messages"] == [{"role": "system", "content": "You are a helpful assistant who answers briefly."},
                                {"role": "user", "content": "Name three colours of the rainbow."}]
    screenshot(page, "web-chat.png")

    # regenerate: the last answer replaced by a new one from the same messages (greedy: the same text)
    page.click("#messages .msg.assistant .regenerate")
    page.wait_for_selector("#stop", state="visible")
    wait_idle(page)
    assert page.locator("#messages .msg").count() == 2
    assert chats[-1]["messages"] == body["messages"] and last_answer(page).inner_text() == final

    # the attention view of that exchange
    page.click("#messages .msg.assistant .attention")
    page.wait_for_selector("#attention[data-ready='1']", timeout=60_000)
    T = int(page.get_attribute("#attention", "data-tokens"))
    assert page.locator("#attn-grid canvas.thumb").count() == LAYERS * HEADS
    assert page.locator("#attn-tokens .tok").count() == T > 20
    roles = page.locator("#attn-tokens .role").all_inner_texts()
    assert [r.lower() for r in roles] == ["system", "user", "assistant"]
    page.locator("#attn-grid canvas.thumb").nth(5 * HEADS + 3).click()  # layer 5, head 3
    assert page.input_value("#attn-layer") == "5" and page.input_value("#attn-head") == "3"
    page.locator("#attn-tokens .tok").nth(T - 3).click()
    assert re.match(rf"token {T - 3} .* attends most to \d+ ", page.inner_text("#attn-hover"))
    shaded = page.eval_on_selector_all("#attn-tokens .tok", "ts => ts.filter(t => t.style.background).length")
    assert shaded == T - 2  # the picked token and the ones before it
    screenshot(page, "web-chat-attention.png")
    page.click("#attn-close")

    # stop mid-answer: the text stops growing, the server cancels the request
    cancelled = server.metric("mhsa_requests_cancelled_total")
    page.fill("#max-tokens", "400")
    page.fill("#temperature", "0.8")
    page.fill("#input", "Tell me a long story about a dragon and a knight.")
    page.press("#input", "Enter")
    wait_until(page, "(() => { const b = [...document.querySelectorAll('#messages .msg.assistant .body')];"
                     " return b.length === 2 && b[1].innerText.length > 20; })()")
    page.click("#stop")
    wait_idle(page, 5_000)
    stopped = last_answer(page).inner_text()
    assert page.inner_text("#messages .msg.assistant >> nth=1 >> .note") == "stopped"
    deadline = time.time() + 10
    while server.metric("mhsa_requests_cancelled_total") == cancelled and time.time() < deadline:
        time.sleep(0.1)
    assert server.metric("mhsa_requests_cancelled_total") == cancelled + 1
    page.wait_for_timeout(300)
    assert last_answer(page).inner_text() == stopped

    # conversations: kept in localStorage, a new one, deleting it
    stored = page.evaluate("JSON.parse(localStorage.getItem('mhsa-chat-conversations'))")
    assert len(stored["conversations"]) == 1 and len(stored["conversations"][0]["messages"]) == 4
    page.click("#new-chat")
    assert page.locator("#messages .msg").count() == 0 and page.locator("#conversations li").count() == 2
    page.fill("#max-tokens", "12")
    page.fill("#input", "Hi")
    page.press("#input", "Enter")
    page.wait_for_selector("#stop", state="visible")
    wait_idle(page)
    page.locator("#conversations li.current .delete").click()
    assert page.locator("#conversations li").count() == 1
    assert page.locator("#messages .msg").count() == 4  # back to the first conversation
    assert not problems, problems


def test_markdown_renders_and_nothing_runs(server, browser):
    page = browser.new_page()
    problems = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(server.url + "/")
    answer = ("Here is code:\n\n```python\nprint('<b>hi</b>')\n```\n\n**bold** and *italic* and `x < y`.\n\n"
              "- one\n- two [a link](https://example.com/) [bad](javascript:window.__xss=4)\n\n"
              "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">")
    conversation = {"id": "crafted", "title": "<img src=x onerror=window.__xss=5>", "system": "", "updated": 1,
                    "messages": [{"role": "user", "content": "<script>window.__xss = 3</script>"},
                                 {"role": "assistant", "content": answer}]}
    page.evaluate("c => localStorage.setItem('mhsa-chat-conversations', JSON.stringify({conversations: [c], current: c.id}))",
                  conversation)
    page.reload()
    page.wait_for_selector("#messages .msg.assistant")
    body = page.locator("#messages .msg.assistant .body")
    assert body.locator("pre code").inner_text() == "print('<b>hi</b>')"
    assert body.locator("pre code").get_attribute("data-lang") == "python"
    assert body.locator("strong").inner_text() == "bold" and body.locator("em").inner_text() == "italic"
    assert body.locator(":not(pre) > code").inner_text() == "x < y"
    assert body.locator("ul li").count() == 2
    assert body.locator("a").count() == 1 and body.locator("a").get_attribute("href") == "https://example.com/"
    assert "[bad](javascript:window.__xss=4)" in body.inner_text()
    assert "<script>window.__xss = 1</script>" in body.inner_text()
    assert page.inner_text("#messages .msg.user .body") == "<script>window.__xss = 3</script>"
    assert page.inner_text("#conversations li .title") == conversation["title"]
    assert page.locator("#messages script, #messages img, #conversations img").count() == 0
    assert page.evaluate("window.__xss") is None
    screenshot(page, "web-chat-markdown.png")
    assert not problems, problems
