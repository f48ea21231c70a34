"""The mhsa command line when things go wrong, run as a user runs it (the embedded default model,
no weights to download):

- a usage error is one line "mhsa: error: <option>: expected <what>, got <what>", then where to
  find the options, and exit status 2 (CLI11's own messages printed 309-digit bounds and exited
  with 105-114);
- output that cannot be written (/dev/full, a file larger than allowed) is an error, exit status 1,
  and a report that was there before is left as it was;
- thread counts that crash OpenMP (-t 100000, OMP_NUM_THREADS=100000) are refused or capped;
- `mhsa generate` checks its model and tokenizer belong together, and echoes the prompt on a terminal;
- `mhsa tokenize` reads the tokenizer generate would use: the default model's bytes without --model.

Run with MHSA_CLI naming the mhsa binary (default: build/mhsa) and, for the import test,
PYTHONPATH (or MHSA_PYTHONPATH) naming the build's python directory.
"""

import json
import os
import pty
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"
DEFAULT_MODEL = ROOT / "models" / "default"  # byte-level: 256 tokens, a context of 512
MAX_THREADS = min(1024, 16 * len(os.sched_getaffinity(0)))
COMMANDS = "attention, bench, chat, explain, generate, perplexity, quantize, serve, tokenize or train"


def run(*args, env=None, **kwargs):
    if "stdout" not in kwargs:
        kwargs.setdefault("capture_output", True)
    return subprocess.run([str(CLI), *map(str, args)], text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env}, **kwargs)


# ---- usage errors ----------------------------------------------------------------------------------

USAGE_ERRORS = [
    (["attention", "-T", "0"], "--tokens: expected an integer \u2265 1, got 0"),
    (["attention", "-T", "abc"], "--tokens: expected an integer \u2265 1, got abc"),
    (["attention", "-T", "99999999999999999999"], "--tokens: expected an integer \u2265 1, got 99999999999999999999"),
    (["attention", "--repeats", "3000000000"], "--repeats: expected an integer in [1, 2147483647], got 3000000000"),
    (["attention", "--seed", "-1"], "--seed: expected an integer in [0, 2^64), got -1"),
    (["attention", "--bogus"], "unknown option --bogus"),
    (["generate", "-n", "-1"], "--max-new-tokens: expected an integer \u2265 0, got -1"),
    (["generate", "--top-p", "1.5"], "--top-p: expected a number in [0, 1], got 1.5"),
    (["generate", "--temperature", "nan"], "--temperature: expected a number \u2265 0, got nan"),
    (["generate", "--repetition-penalty", "0"], "--repetition-penalty: expected a number > 0, got 0"),
    (["generate", "--seed", "-1"], "--seed: expected an integer in [0, 2^64), got -1"),
    (["explain", "--prompt", "x", "--format", "pdf"], "--format: expected html or text, got 'pdf'"),
    (["bench", "--min-seconds", "0"], "--min-seconds: expected a number > 0, got 0"),
    (["train", "--data", "x", "--out", "y", "--context", "1"], "--context: expected an integer in [2, 65536], got 1"),
    (["tokenize", "--model", TOKENIZER], "TEXT is required"),
    (["bogus"], f"unknown command 'bogus': expected {COMMANDS}"),
    ([], f"expected a command ({COMMANDS}), got none"),
]


@pytest.mark.parametrize("args,message", USAGE_ERRORS, ids=[" ".join(map(str, a)) or "(none)" for a, _ in USAGE_ERRORS])
def test_usage_errors_are_one_clean_line_and_exit_2(args, message):
    r = run(*args)
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert lines[0] == "mhsa: error: " + message
    assert len(lines) == 2 and re.fullmatch(r"Run 'mhsa( \w+)? --help' for the (options|commands)\.", lines[1]), lines
    assert r.stdout == ""


@pytest.mark.parametrize("args", [["--help"], ["attention", "--help"], ["--version"]])
def test_help_and_version_exit_0(args):
    r = run(*args)
    assert r.returncode == 0 and r.stdout and r.stderr == ""


def test_a_repeated_option_takes_the_last_value():
    r = run("attention", "-B", "1", "-H", "1", "-T", "2", "-T", "4", "-D", "8", "--repeats", "1")
    assert r.returncode == 0 and "q [1, 1, 4, 8]" in r.stdout, r.stderr


# ---- threads ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["attention"], ["bench"], ["explain", "--prompt", "x"], ["generate"],
                                     ["train", "--data", "x", "--out", "y"]])
@pytest.mark.parametrize("threads", ["100000", "-1"])
def test_thread_counts_out_of_range_are_refused(command, threads):
    r = run(*command, "-t", threads)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"mhsa: error: --threads: expected an integer in [0, {MAX_THREADS}], got {threads}\n")


def test_omp_num_threads_too_large_is_capped_with_a_warning():
    r = run("attention", "-B", "1", "-H", "2", "-T", "64", "-D", "16", "--repeats", "1",
            env={"OMP_NUM_THREADS": "100000"})
    assert r.returncode == 0, (r.returncode, r.stderr)  # was SIGSEGV in libgomp
    assert r.stderr.startswith("mhsa: warning: OMP_NUM_THREADS=100000: more threads than mhsa runs "
                               f"(16 \u00d7 the {len(os.sched_getaffinity(0))} processors, 1024 at most); "
                               f"using {MAX_THREADS}\n")
    assert "GFLOP/s" in r.stdout


def test_python_import_caps_omp_num_threads():
    code = ("import warnings, numpy as np\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import mhsa\n"
            "print([str(x.message) for x in w])\n"
            "q = np.ones((1, 2, 300, 16), np.float32)\n"
            "print(mhsa.scaled_dot_product_attention(q, q, q).shape)\n"
            # OpenMP keeps the thread count per thread: another Python thread must be capped too.
            "import threading\n"
            "t = threading.Thread(target=lambda: print(mhsa.scaled_dot_product_attention(q, q, q).shape))\n"
            "t.start(); t.join()\n")
    path = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "100000", "PYTHONPATH": path})
    assert r.returncode == 0, (r.returncode, r.stderr)  # was SIGSEGV in libgomp
    assert "mhsa: OMP_NUM_THREADS=100000: more threads than mhsa runs" in r.stdout
    assert r.stdout.endswith("(1, 2, 300, 16)\n(1, 2, 300, 16)\n")


# ---- output that cannot be written ------------------------------------------------------------------

STDOUT_COMMANDS = {
    "tokenize": ["tokenize", "--model", TOKENIZER, "Hello world"],
    "tokenize --decode": ["tokenize", "--model", TOKENIZER, "--decode", "15496 995"],
    "generate": ["generate", "--prompt", "Hello", "-n", "4"],
    "generate --json": ["generate", "--prompt", "Hello", "-n", "4", "--json"],
    "explain --format text": ["explain", "--prompt", "Hello there", "--format", "text"],
    "attention": ["attention", "-B", "1", "-H", "1", "-T", "8", "-D", "8", "--repeats", "1"],
}


@pytest.mark.parametrize("name", list(STDOUT_COMMANDS))
def test_a_full_standard_output_is_an_error(name):
    with open("/dev/full", "w") as full:
        r = run(*STDOUT_COMMANDS[name], stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 1, r.stderr
    assert "mhsa: error: writing standard output: No space left on device\n" in r.stderr


@pytest.mark.parametrize("args", [["explain", "--prompt", "Hi", "--out"], ["explain", "--prompt", "Hi", "--json"],
                                  ["bench", "--filter", "no such case", "--min-seconds", "0.01", "--json"]])
def test_a_full_output_file_is_an_error(args):
    r = run(*args, "/dev/full")
    assert r.returncode == 1, r.stderr
    assert f"mhsa: error: {args[-1]}: writing '/dev/full': No space left on device\n" in r.stderr


def limit_file_size(size):
    """For preexec_fn: writes past `size` bytes fail with EFBIG (a full disk, without root)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def test_a_failed_report_leaves_the_previous_one(tmp_path):
    report = tmp_path / "r.html"
    report.write_text("the previous report")
    r = run("explain", "--prompt", "Hello there", "--out", report, preexec_fn=limit_file_size(20_000))
    assert r.returncode == 1, r.stderr
    assert f"mhsa: error: --out: writing '{report}': File too large" in r.stderr
    assert report.read_text() == "the previous report"  # was truncated
    assert sorted(tmp_path.iterdir()) == [report]  # no temporary file left behind


def test_a_report_replaces_the_file_a_link_points_to(tmp_path):
    real, link = tmp_path / "real.html", tmp_path / "link.html"
    real.write_text("old")
    real.chmod(0o640)
    link.symlink_to(real)
    r = run("explain", "--prompt", "Hello there", "--out", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and real.read_text().startswith("<!DOCTYPE html>")
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(tmp_path.iterdir()) == [link, real]


# ---- generate ---------------------------------------------------------------------------------------

def test_generate_refuses_a_prompt_longer_than_the_context():
    r = run("generate", "--prompt", "x" * 600)
    assert r.returncode == 2
    assert ("--prompt: expected at most 511 tokens (the model's context is 512 tokens, less one for a new token), "
            "got 600 tokens") in r.stderr
    r = run("generate", "--prompt", "x" * 600, "-n", "0")
    assert "--prompt: expected at most 512 tokens (the model's context is 512 tokens), got 600 tokens" in r.stderr


def test_tokenize_reads_the_models_generate_runs(tmp_path):
    """Without --model, tokenize uses the default model generate runs (byte-level: a text's bytes);
    a byte-level model's directory (config.json of 256 tokens, no tokenizer files) likewise; a
    directory of a larger vocabulary without tokenizer files is an error naming both."""
    text = "Hi é\u4e2d\n"
    want = " ".join(str(b) for b in text.encode())
    for args in ([], ["--model", DEFAULT_MODEL]):
        r = run("tokenize", *args, text)
        assert r.returncode == 0 and r.stdout.strip() == want, r.stderr
        r = run("tokenize", *args, "--decode", want)
        assert r.returncode == 0 and r.stdout == text, r.stderr
    j = json.loads(run("tokenize", "--json", "a b").stdout)
    assert j == {"ids": [97, 32, 98], "tokens": ["a", "\u0120", "b"]}  # bytes as GPT-2's files spell them
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    r = run("tokenize", "--model", tmp_path, "x")
    assert r.returncode == 2 and "vocab.json and merges.txt (or a byte-level model of 256 tokens)" in r.stderr
    assert "for a vocabulary of 300" in r.stderr


def test_generate_and_explain_refuse_a_tokenizer_of_another_model(tmp_path):
    for f in ("config.json", "model.safetensors"):
        shutil.copy(DEFAULT_MODEL / f, tmp_path / f)
    shutil.copy(TOKENIZER / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(TOKENIZER / "vocab.bpe", tmp_path / "merges.txt")
    message = (f"mhsa: error: --model: expected a tokenizer of at most the model's 256 tokens (vocab_size in "
               f"config.json), got one of 50257 tokens in '{tmp_path}'\n")
    for args in (["generate", "--prompt", "Hello"], ["explain", "--prompt", "Hello", "--format", "text"]):
        r = run(*args, "--model", tmp_path)
        assert r.returncode == 2 and r.stderr == message, r.stderr


def run_on_a_terminal(*args):
    """stdout on a pseudo-terminal; returns (exit status, what it printed)."""
    primary, secondary = pty.openpty()
    r = run(*args, stdout=secondary, stderr=subprocess.PIPE)
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    return r.returncode, out.decode().replace("\r\n", "\n")


def test_generate_echoes_the_prompt_on_a_terminal():
    args = ["generate", "--prompt", "Once upon a time", "-n", "6", "-t", "1"]
    continuation = run(*args).stdout  # a pipe: the continuation only
    assert run(*args, "--echo").stdout == "Once upon a time" + continuation
    assert run_on_a_terminal(*args) == (0, "Once upon a time" + continuation)
    assert run_on_a_terminal(*args, "--no-echo") == (0, continuation)
    # Speeds, and speculation's counts (its tuner picks draft lengths from measured times), vary run to run.
    timeless = lambda r: {k: v for k, v in json.loads(r.stdout).items()
                          if not k.endswith("_per_s") and k != "speculation"}
    assert timeless(run(*args, "--json")) == timeless(run(*args, "--json", "--echo"))  # --json: unchanged


# ---- bench --model ----------------------------------------------------------------------------------

@pytest.mark.parametrize("context", [1000, 97])
def test_bench_model_times_prompt_processing_and_decoding_of_a_directory(tmp_path, context):
    """`mhsa bench --model DIR` on a random Llama written by transformers (no tokenizer): the cases
    bench/compare_llama_cpp.py reads, <family>_pp512 and _tg128 (fewer tokens for a short context)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=83, hidden_size=24, intermediate_size=37, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m", safe_serialization=True)
    r = run("bench", "--model", tmp_path / "m", "--min-seconds", "0.01", "--json", tmp_path / "b.json", "-t", "1")
    assert r.returncode == 0, r.stderr
    cases = json.loads((tmp_path / "b.json").read_text())["cases"]
    pp, tg = min(512, context), min(128, context)
    assert [c["name"] for c in cases] == [f"llama_pp{pp}", f"llama_tg{tg}"]
    assert [c["tokens"] for c in cases] == [pp, tg]
    assert [c["unit"] for c in cases] == ["GFLOP/s", "GB/s"]
    for c in cases:
        assert 0 < c["seconds"] <= c["median_seconds"] and c["work"] > 0
    assert f"llama_pp{pp} " in r.stdout and "tokens/s" in r.stdout


def test_bench_model_depth_and_batch(tmp_path):
    """--depth N decodes after an N-token prompt ("_d<N>"); --batch N decodes N sequences together
    through Model::step ("_b<N>", tokens counting every sequence's, the weights' bytes once per
    step), --paged B with their caches in a pool of B-token blocks as mhsa serve keeps them
    ("_paged<B>", the same bytes); a depth that leaves no room is refused with the numbers; all
    need --model, --paged a power of two and --batch."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=83, hidden_size=24, intermediate_size=37, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=200)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m", safe_serialization=True)
    work = {}
    for extra, name, tokens in [([], "llama_tg128", 128), (["--depth", "50"], "llama_tg128_d50", 128),
                                (["--batch", "5"], "llama_tg128_b5", 640),
                                (["--depth", "70", "--batch", "5"], "llama_tg126_d70_b5", 630),
                                (["--depth", "70", "--batch", "5", "--paged", "8"], "llama_tg126_d70_b5_paged8", 630)]:
        r = run("bench", "--model", tmp_path / "m", "--filter", "tg", "--min-seconds", "0.01", "--json",
                tmp_path / "b.json", "-t", "1", *extra)
        assert r.returncode == 0, r.stderr
        [case] = json.loads((tmp_path / "b.json").read_text())["cases"]
        assert (case["name"], case["tokens"], case["unit"]) == (name, tokens, "GB/s"), case
        work[name] = case["work"]
    # Deeper caches are more bytes; five sequences read the weights once a step, so less than 5x.
    assert work["llama_tg128"] < work["llama_tg128_d50"]
    assert work["llama_tg128"] < work["llama_tg128_b5"] < 5 * work["llama_tg128"]
    assert work["llama_tg126_d70_b5_paged8"] == work["llama_tg126_d70_b5"]
    r = run("bench", "--model", tmp_path / "m", "--depth", "197", "--batch", "4", "--min-seconds", "0.01")
    assert r.returncode == 2 and "--depth: expected at most 196 (the model's context less --batch), got 197" in r.stderr
    for extra in (["--batch", "2"], ["--depth", "3"], ["--batch", "2", "--paged", "16"]):
        r = run("bench", *extra, "--min-seconds", "0.01")
        assert r.returncode == 2 and "expected with --model" in r.stderr, r.stderr
    for extra, message in ((["--batch", "2", "--paged", "12"], "--paged: expected a power of two (tokens per block), got 12"),
                           (["--paged", "16"], "--paged: expected with --batch 2 or more")):
        r = run("bench", "--model", tmp_path / "m", *extra, "--min-seconds", "0.01")
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_bench_profile_shows_where_each_forward_goes(tmp_path):
    """--profile: after each model case, its forwards' time phase by phase (per forward, per layer,
    share), and in --json each phase's seconds per forward; "other" takes the rest, so the phases
    sum to the mean forward, which is at least the best run's; without --model it is refused."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=83, hidden_size=24, intermediate_size=37, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=200)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m", safe_serialization=True)
    phases = ["embed", "norm", "qkv", "attention", "out_proj", "mlp_in", "activation", "mlp_out", "residual", "head",
              "other"]
    for extra, steps in (([], 128), (["--batch", "3", "--paged", "8"], 128)):
        r = run("bench", "--model", tmp_path / "m", "--min-seconds", "0.05", "--json", tmp_path / "b.json", "-t", "1",
                "--profile", *extra)
        assert r.returncode == 0, r.stderr
        cases = json.loads((tmp_path / "b.json").read_text())["cases"]
        assert len(cases) == 2
        for case in cases:
            prof = case["profile"]
            assert prof["layers"] == 3
            assert list(prof["seconds_per_forward"]) == phases
            per_run = 1 if "_pp" in case["name"] else steps  # forwards (steps) per timed run
            assert prof["forwards"] % per_run == 0 and prof["forwards"] >= 3 * per_run, prof
            times = prof["seconds_per_forward"]
            assert all(v >= 0 for v in times.values()), times
            assert all(times[p] > 0 for p in ("qkv", "attention", "out_proj", "mlp_in", "mlp_out", "head")), times
            assert sum(times.values()) >= 0.99 * case["seconds"] / per_run, (times, case["seconds"])
        assert r.stdout.count("where a forward's") == 2
        for p in phases:
            assert re.search(rf"^    {p} +[0-9.]+ ", r.stdout, re.M), (p, r.stdout)
    r = run("bench", "--model", tmp_path / "m", "--filter", "tg", "--min-seconds", "0.01", "--json", tmp_path / "b.json")
    assert r.returncode == 0 and "where a forward" not in r.stdout
    assert "profile" not in json.loads((tmp_path / "b.json").read_text())["cases"][0]
    r = run("bench", "--profile", "--min-seconds", "0.01")
    assert r.returncode == 2 and "--profile: expected with --model" in r.stderr, r.stderr


def test_bench_model_refuses_a_directory_without_a_model(tmp_path):
    r = run("bench", "--model", tmp_path, "--min-seconds", "0.01")
    assert r.returncode == 2 and "config.json" in r.stderr and r.stderr.startswith("mhsa: error: "), r.stderr
    assert r.stdout == ""  # refused before the peak and bandwidth measurements
