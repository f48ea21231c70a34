"""`mhsa explain` end to end: random GPT-2 checkpoints written by Hugging Face transformers (with
GPT-2's real tokenizer files), the CLI run as a user runs it, and

- the probabilities of the JSON and of the report against the reference: q and k recomputed by
  transformers in float64 from the same checkpoint, then mhsa.attention_probabilities and a plain
  float64 softmax, within 1e-6;
- the report in a real browser: Debian's Chromium (/usr/bin/chromium), headless, --no-sandbox, a
  fresh profile, driven by Playwright: no console errors, one heatmap per layer × head, a click
  enlarges a head, and a screenshot that is not blank;
- a 1000-token prompt: the report's size and the time until the page says it is ready;
- a conversation (--messages) through a chat template: each token's role in the JSON and the
  report, a label where each message begins, the text through transformers' apply_chat_template.

Run with PYTHONPATH (or MHSA_PYTHONPATH) naming the build's python directory and MHSA_CLI its mhsa.
"""

import base64
import io
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"
CHROMIUM = Path("/usr/bin/chromium")
PROMPT = "The tiger jumped out of a tree to get a drink because it was thirsty"
# Words that are one GPT-2 token each with their leading space: N words make N tokens.
WORDS = " the quick brown fox jumps over the lazy dog".split(" ")[1:]


def make_model_dir(path, n_layer, n_head, n_embd, seed):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_positions=1024)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # GPT-2's init gives nearly even attention: sharpen the heads, vary the rest
        for name, p in model.named_parameters():
            if "attn.c_attn.weight" in name:
                p.mul_(4.0)
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    shutil.copy(TOKENIZER / "encoder.json", path / "vocab.json")
    shutil.copy(TOKENIZER / "vocab.bpe", path / "merges.txt")
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2-explain")
    return d, make_model_dir(d, n_layer=2, n_head=4, n_embd=64, seed=1234)


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """GPT-2 small's 12 layers × 12 heads (narrow channels): the head count drives the report's size."""
    d = tmp_path_factory.mktemp("gpt2-explain-wide")
    make_model_dir(d, n_layer=12, n_head=12, n_embd=48, seed=99)
    return d


def run(*args, check=True, stdin=None):
    r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=300, input=stdin)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def reference_probabilities(model, ids):
    """Per layer [1, H, T, T]: q, k from transformers in float64, then (mhsa.attention_probabilities
    on them as float32, a float64 softmax written out here)."""
    import mhsa
    m = model.to(torch.float64)
    cfg = m.config
    T, C, H = len(ids), cfg.n_embd, cfg.n_head
    D = C // H
    with torch.no_grad():
        hidden = m.transformer(torch.tensor([ids]), output_hidden_states=True).hidden_states  # [l]: block l's input
        ours, plain = [], []
        for layer, block in enumerate(m.transformer.h):
            q, k, _ = block.attn.c_attn(block.ln_1(hidden[layer]))[0].split(C, dim=-1)
            q, k = (t.view(T, H, D).transpose(0, 1)[None] for t in (q, k))  # [1, H, T, D]
            ours.append(mhsa.attention_probabilities(q.float().numpy(), k.float().numpy(), is_causal=True))
            scores = (q @ k.transpose(-1, -2)) / np.sqrt(D)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            plain.append(torch.softmax(scores, dim=-1).numpy())
    model.to(torch.float32)
    return ours, plain


def read_report(path):
    """The report's data blocks: meta (JSON) and the base64 blocks, decoded to bytes."""
    html = Path(path).read_text(encoding="utf-8")
    blocks = dict(re.findall(r'<script id="([\w-]+)" type="[^"]+">(.*?)</script>', html, flags=re.S))
    meta = json.loads(blocks.pop("mhsa-meta"))
    return meta, {k: base64.b64decode(v) for k, v in blocks.items()}, html


def lower(values, n):
    """A lower-triangle row-by-row layout back to an [n, n] matrix (zeros above the diagonal)."""
    m = np.zeros((n, n), dtype=np.float64)
    m[np.tril_indices(n)] = values
    return m


def max_pool(p, n):
    """The report's pooling: block b holds tokens [b·T/n, (b+1)·T/n), the max over each block pair."""
    T = p.shape[0]
    edges = [b * T // n for b in range(n + 1)]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            out[i, j] = p[edges[i]:edges[i + 1], edges[j]:edges[j + 1]].max()
    return out


# ---- numbers -------------------------------------------------------------------------------------

def test_json_equals_the_reference_probabilities(model_dir, tmp_path):
    import mhsa
    d, model = model_dir
    run("explain", "--model", d, "--prompt", PROMPT, "--json", tmp_path / "a.json")
    j = json.loads((tmp_path / "a.json").read_text())
    tok = mhsa.Tokenizer.load(TOKENIZER)
    ids = tok.encode(PROMPT)
    assert j["ids"] == ids
    assert j["tokens"] == [tok.token_string(i) for i in ids]  # "Ġtiger", as BertViz gets them from transformers
    attention = np.array(j["attention"])
    T = len(ids)
    assert attention.shape == (2, 1, 4, T, T)  # [layer][B][H][Tq][Tk]
    ours, plain = reference_probabilities(model, ids)
    for layer in range(2):
        assert np.abs(attention[layer] - ours[layer]).max() <= 1e-6
        assert np.abs(attention[layer] - plain[layer]).max() <= 1e-6
    assert attention.max() > 0.6  # the heads are not flat: a meaningful comparison


def test_report_holds_the_exact_chosen_head_and_every_head_to_1_255(model_dir, tmp_path):
    d, model = model_dir
    run("explain", "--model", d, "--prompt", PROMPT, "--layer", 1, "--head", 2, "--out", tmp_path / "r.html",
        "--json", tmp_path / "r.json")
    meta, blobs, html = read_report(tmp_path / "r.html")
    j = json.loads((tmp_path / "r.json").read_text())
    T = len(j["tokens"])
    assert meta["chosen"] == [1, 2] and meta["layers"] == 2 and meta["heads"] == 4 and len(meta["tokens"]) == T
    assert meta["tokens"][1] == " tiger"  # the report shows the text, not GPT-2's byte alphabet
    assert meta["labels"][1] == "\u00b7tiger"  # and labels where a space is seen
    assert "http://" not in html and "https://" not in html and "<link rel=\"stylesheet\"" not in html
    exact = lower(np.frombuffer(blobs["mhsa-exact"], dtype="<f4"), T)
    json_head = np.array(j["attention"][1][0][2], dtype=np.float32)
    assert np.array_equal(exact, json_head)  # bit for bit the JSON's float32 values
    ours, plain = reference_probabilities(model, j["ids"])
    assert np.abs(exact - ours[1][0, 2]).max() <= 1e-6
    assert np.abs(exact - plain[1][0, 2]).max() <= 1e-6
    # Every head at display precision: round(255 p), full resolution for a short prompt.
    assert meta["detail_size"] == T and meta["thumb_size"] == T
    thumbs = np.frombuffer(blobs["mhsa-thumbs"], dtype=np.uint8).reshape(2 * 4, -1)
    for layer in range(2):
        for head in range(4):
            detail = lower(np.frombuffer(blobs[f"mhsa-detail-{layer}-{head}"], dtype=np.uint8), T) / 255
            assert np.abs(detail - plain[layer][0, head]).max() <= 0.5 / 255 + 1e-6
            assert np.array_equal(lower(thumbs[layer * 4 + head], T) / 255, detail)
    # The walk-through's numbers are the head's: its softmax rows are the exact probabilities.
    trace = meta["trace"]
    assert trace["rows"] == list(range(T))
    assert np.allclose(np.array(trace["probs"], dtype=float), exact, atol=1e-4)
    assert len(trace["q"][0]) == 16 and len(trace["concat"][0]) == 64
    assert trace["scaled"][0][1] is None  # the masked future, −∞
    s = meta["summaries"]
    p = plain[1][0, 2]
    assert s["previous_token"][1][2] == pytest.approx(np.mean([p[i, i - 1] for i in range(1, T)]), abs=1e-6)
    assert s["first_token"][1][2] == pytest.approx(p[1:, 0].mean(), abs=1e-6)


def test_text_format_is_a_heatmap_of_one_head(model_dir):
    d, _ = model_dir
    out = run("explain", "--model", d, "--prompt", PROMPT, "--format", "text", "--layer", 1, "--head", 3).stdout
    lines = out.splitlines()
    assert lines[0].startswith("layer 1, head 3")
    rows = [line for line in lines if "\u2502" in line]
    assert len(rows) == 15 and rows[1].startswith(" 1 \u00b7tiger")  # a space shown as ·
    for i, row in enumerate(rows):  # row i has i + 1 cells: the keys it may see
        cells = row.split("\u2502")[1]
        assert len(cells) == i + 1 and set(cells) <= set("\u00b7\u2591\u2592\u2593\u2588")
    assert rows[0].endswith("\u2588")  # the first token attends only to itself
    assert lines[-1].startswith("entropy ")


def test_bad_requests_are_clear_errors(model_dir, tmp_path):
    d, _ = model_dir
    cases = [
        (["--model", tmp_path / "absent", "--prompt", "Hi", "--out", tmp_path / "x.html"], "--model: expected a model directory"),
        (["--model", d, "--prompt", "Hi", "--layer", 2, "--out", tmp_path / "x.html"], "--layer: expected a layer in [0, 2), got 2"),
        (["--model", d, "--prompt", "Hi", "--head", -1, "--out", tmp_path / "x.html"], "--head: expected a head in [0, 4), got -1"),
        (["--model", d, "--prompt", "", "--out", tmp_path / "x.html"], "--prompt: expected some text, got an empty prompt"),
        (["--model", d, "--prompt", "Hi"], "--out: expected a file for the HTML report"),
        (["--model", d, "--prompt", " ".join(WORDS * 120), "--out", tmp_path / "x.html"],
         "--prompt: expected at most 1024 tokens (the model's context), got 1080 tokens"),
    ]
    for args, message in cases:
        r = run("explain", *args, check=False)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (message, r.stderr)
    assert not (tmp_path / "x.html").exists()


# ---- conversations ------------------------------------------------------------------------------

CONVERSATION = [{"role": "system", "content": "The quick brown fox"}, {"role": "user", "content": "Hello world!"},
                {"role": "assistant", "content": " The lazy dog."}, {"role": "user", "content": "42 \u00e9"}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tiny_chat_model import write_chat_dir
    d = tmp_path_factory.mktemp("chat-explain")
    write_chat_dir(d, tokens=300, padding=0, max_positions=512, seed=5, edit=lambda m, t: None)
    return d


def test_messages_label_each_token_with_its_role(chat_dir, tmp_path):
    from tiny_chat_model import hf_tokenizer
    (tmp_path / "m.json").write_text(json.dumps(CONVERSATION))
    run("explain", "--model", chat_dir, "--messages", tmp_path / "m.json", "--json", tmp_path / "r.json",
        "--out", tmp_path / "r.html")
    out = json.loads((tmp_path / "r.json").read_text())
    hf = hf_tokenizer(chat_dir)
    text = hf.apply_chat_template(CONVERSATION, tokenize=False)
    assert out["ids"] == hf.encode(text, add_special_tokens=False)
    roles = out["roles"]
    assert len(roles) == len(out["ids"])
    runs = [r for i, r in enumerate(roles) if i == 0 or roles[i - 1] != r]
    assert runs == [m["role"] for m in CONVERSATION]
    for k, m in enumerate(CONVERSATION):  # each message's tokens hold its content, in its template markup
        start = [i for i, r in enumerate(roles) if i == 0 or roles[i - 1] != r][k]
        end = ([i for i, r in enumerate(roles) if i > 0 and roles[i - 1] != r] + [len(roles)])[k]
        part = hf.decode(out["ids"][start:end])
        assert part.startswith("<|im_start|>" + m["role"]) and m["content"] in part, (k, part)
    meta, _, _ = read_report(tmp_path / "r.html")
    assert meta["roles"] == roles
    r = run("explain", "--model", chat_dir, "--messages", tmp_path / "m.json", "--prompt", "x", check=False)
    assert r.returncode == 2 and "expected --prompt or --messages, got both" in r.stderr
    r = run("explain", "--model", chat_dir, "--out", tmp_path / "x.html", check=False)
    assert r.returncode == 2 and "expected --prompt TEXT or --messages FILE, got neither" in r.stderr
    long = [{"role": "user", "content": "Hello world!"}] * 2000  # past the 512-token context: refused before
    (tmp_path / "long.json").write_text(json.dumps(long))        # its 2000 prefixes are rendered
    r = run("explain", "--model", chat_dir, "--messages", tmp_path / "long.json", "--out", tmp_path / "x.html", check=False)
    assert r.returncode == 2 and "--messages: expected at most 512 tokens (the model's context), got" in r.stderr
    (tmp_path / "bad.json").write_text('[{"role": "user"}]')
    r = run("explain", "--model", chat_dir, "--messages", tmp_path / "bad.json", "--out", tmp_path / "x.html", check=False)
    assert r.returncode == 2 and "content" in r.stderr and r.stdout == "", r.stderr


# ---- the browser ---------------------------------------------------------------------------------

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
    profile = tmp_path_factory.mktemp("chromium-profile")  # fresh: nothing cached from another run
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"],
            viewport={"width": 1400, "height": 1000})
        yield context
        context.close()


def open_report(browser, path):
    """Opens a report; returns (page, problems, seconds from navigation to the page's ready marker)."""
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(Path(path).resolve().as_uri())
    page.wait_for_function("document.documentElement.dataset.ready === 'true'", timeout=30_000)
    ready_s = page.evaluate("window.mhsaReadyMs") / 1000  # performance.now(): since navigation started
    return page, problems, ready_s


def picture_stats(png):
    from PIL import Image
    img = Image.open(io.BytesIO(png)).convert("RGB")
    pixels = np.asarray(img).reshape(-1, 3)
    colours = len(np.unique(pixels, axis=0))
    not_white = float((pixels.min(axis=1) < 235).mean())
    return colours, not_white, img.size


def test_report_works_in_a_browser(model_dir, browser, tmp_path):
    d, _ = model_dir
    run("explain", "--model", d, "--prompt", PROMPT, "--layer", 1, "--head", 2, "--out", tmp_path / "r.html")
    page, problems, _ = open_report(browser, tmp_path / "r.html")
    thumbs = page.locator("canvas.thumb")
    assert thumbs.count() == 2 * 4
    assert sorted((int(t.get_attribute("data-layer")), int(t.get_attribute("data-head"))) for t in thumbs.all()) == \
        [(l, h) for l in range(2) for h in range(4)]
    assert page.get_attribute("#detail", "data-layer") == "1" and page.get_attribute("#detail", "data-head") == "2"

    target = page.locator("canvas.thumb[data-layer='0'][data-head='3']")
    target.click()
    assert page.get_attribute("#detail", "data-layer") == "0" and page.get_attribute("#detail", "data-head") == "3"
    assert "Layer 0, head 3" in page.inner_text("#detail-title")
    small, big = target.bounding_box(), page.locator("#detail-canvas").bounding_box()
    assert big["width"] > 4 * small["width"] and big["height"] > 4 * small["height"]  # enlarged
    assert "selected" in target.get_attribute("class")
    assert page.get_attribute("#lines", "data-layer") == "0" and page.get_attribute("#lines", "data-head") == "3"
    page.hover("#detail-canvas", position={"x": big["width"] - 20, "y": big["height"] - 20})
    assert "thirsty" in page.inner_text("#detail-hover")

    assert page.locator("#walk .step").count() >= 10
    assert page.locator("#summary td").count() == 2 * 4

    shot = page.screenshot(full_page=False)
    colours, not_white, size = picture_stats(shot)
    assert size == (1400, 1000)
    assert colours > 200 and not_white > 0.05, (colours, not_white)
    heatmap = page.locator("#detail-canvas").screenshot()
    colours, not_white, _ = picture_stats(heatmap)
    assert colours > 20 and not_white > 0.1, (colours, not_white)  # labels and the masked half are light
    assert problems == []
    page.close()


def test_report_shows_spaces_newlines_and_tabs(model_dir, browser, tmp_path):
    d, _ = model_dir
    run("explain", "--model", d, "--prompt", "Hi there,\n\tfriend  \r\n", "--out", tmp_path / "r.html",
        "--json", tmp_path / "r.json")
    meta, _, _ = read_report(tmp_path / "r.html")
    tokens = json.loads((tmp_path / "r.json").read_text())["tokens"]
    assert "".join(meta["tokens"]) == "Hi there,\n\tfriend  \r\n"  # the text itself; the JSON keeps GPT-2's
    assert tokens[1] == "\u0120there" and meta["labels"][1] == "\u00b7there"
    glyphs = str.maketrans({" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"})
    assert meta["labels"] == [t.translate(glyphs) for t in meta["tokens"]]
    page, problems, _ = open_report(browser, tmp_path / "r.html")
    chips = page.locator("#prompt .tok")
    assert chips.count() == len(meta["tokens"])
    for i, label in enumerate(meta["labels"]):  # every chip shows its label, the drawn characters dimmed
        chip = chips.nth(i)
        assert chip.inner_text() == label
        drawn = "".join(c for c, t in zip(label, meta["tokens"][i]) if c != t)
        assert "".join(chip.locator(".ws").all_inner_texts()) == drawn
    assert problems == []
    page.close()


def test_report_shows_each_messages_role(chat_dir, browser, tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(CONVERSATION))
    run("explain", "--model", chat_dir, "--messages", tmp_path / "m.json", "--out", tmp_path / "r.html")
    page, problems, _ = open_report(browser, tmp_path / "r.html")
    labels = page.locator("#prompt .role")
    assert labels.all_inner_texts() == [m["role"].upper() for m in CONVERSATION]  # CSS upper-cases them
    meta, _, _ = read_report(tmp_path / "r.html")
    assert page.locator("#prompt .tok").count() == len(meta["roles"])
    assert "(assistant)" in page.locator("#prompt .tok").nth(meta["roles"].index("assistant")).get_attribute("title")
    page.screenshot(path=str(tmp_path / "roles.png"))
    assert problems == []
    page.close()


@pytest.mark.parametrize("which", ["2x4", "12x12"])
def test_1000_token_report_is_small_and_opens_fast(which, model_dir, wide_model_dir, browser, tmp_path, record_property):
    d = model_dir[0] if which == "2x4" else wide_model_dir
    prompt = "The" + "".join(" " + WORDS[i % len(WORDS)] for i in range(999))
    report = tmp_path / "long.html"
    t0 = time.perf_counter()
    run("explain", "--model", d, "--prompt", "-", "--layer", 1, "--head", 1, "--out", report, stdin=prompt)
    cli_s = time.perf_counter() - t0
    size_mb = report.stat().st_size / 1e6
    meta, blobs, _ = read_report(report)
    assert len(meta["tokens"]) == 1000
    page, problems, ready_s = open_report(browser, report)
    record_property("report_mb", round(size_mb, 2))
    record_property("ready_s", round(ready_s, 3))
    print(f"\n{which}: 1000-token report {size_mb:.2f} MB, written in {cli_s:.2f} s, ready in the browser after "
          f"{ready_s:.3f} s")
    assert size_mb < 20
    assert ready_s < 3.0
    assert page.locator("canvas.thumb").count() == meta["layers"] * meta["heads"]

    # Stored compactly: thumbnails and (for many heads) details max-pooled from the exact values.
    T, n = 1000, meta["detail_size"]
    exact = lower(np.frombuffer(blobs["mhsa-exact"], dtype="<f4"), T)
    assert np.allclose(exact.sum(axis=1), 1, atol=1e-5)
    thumbs = np.frombuffer(blobs["mhsa-thumbs"], dtype=np.uint8).reshape(meta["layers"] * meta["heads"], -1)
    chosen = 1 * meta["heads"] + 1
    assert meta["thumb_size"] == 64
    assert np.abs(lower(thumbs[chosen], 64) / 255 - max_pool(exact, 64)).max() <= 0.5 / 255 + 1e-6
    detail = lower(np.frombuffer(blobs["mhsa-detail-1-1"], dtype=np.uint8), n) / 255
    want = exact if n == T else max_pool(exact, n)
    assert np.abs(detail - want).max() <= 0.5 / 255 + 1e-6
    if which == "12x12":
        assert n < T  # 144 heads of 1000² do not fit: pooled

    # Enlarging another head and the long token view work without errors.
    page.locator("canvas.thumb[data-layer='0'][data-head='0']").click()
    assert page.get_attribute("#detail", "data-head") == "0"
    assert page.locator("#detail-canvas").bounding_box()["width"] >= 300
    assert problems == []
    page.close()
