"""The mhsa command line as a llama.cpp user types it: short spellings (-m -p -n -c -s, --temp), a
mistyped option or command named with the nearest real one, `mhsa help CMD`, a random seed that is
reported when sampling, chat taking generate's sampling and stop options, messages without C++
names, aligned help, and the edges (-n past the context, ids outside the vocabulary) handled.

Runs the kjv model (byte-level, 512 tokens of context: quick) and, for chat, the same model with
ChatML's template from tests/data. MHSA_CLI names the binary (default: build/mhsa).
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
CHATML = ROOT / "tests" / "data" / "chat_templates" / "chatml.jinja"
COMMANDS = ["attention", "bench", "chat", "explain", "generate", "perplexity", "quantize", "serve", "tokenize", "train"]
KJV_CHAT = ["chat", "-m", "kjv", "--chat-template", CHATML]


# One thread, waiting passively: these runs are short, and side by side with other tests spinning
# OpenMP threads would fight for the cores.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}


def run(*args, **kwargs):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120, env=ENV, **kwargs)


def input_error(r, message):
    """An error in what an option named (found once the command runs): one line, status 2."""
    assert r.returncode == 2 and r.stderr == f"mhsa: error: {message}\n", r.stderr


def usage_error(r, message, command=None):
    """A usage error: exactly `message` after "mhsa: error: ", then where the options are; status 2."""
    assert r.returncode == 2, r.stderr
    where = f"Run 'mhsa {command} --help' for the options." if command else "Run 'mhsa --help' for the commands."
    assert r.stderr == f"mhsa: error: {message}\n{where}\n"


# ---- short spellings -------------------------------------------------------------------------------

def test_short_spellings_equal_the_long_ones():
    short = run("generate", "-m", "kjv", "-p", "And God", "-n", "12", "--temp", "0.9", "-s", "5", "--json")
    long = run("generate", "--model", "kjv", "--prompt", "And God", "--max-new-tokens", "12", "--temperature", "0.9",
               "--seed", "5", "--json")
    assert short.returncode == 0 and long.returncode == 0, (short.stderr, long.stderr)
    a, b = json.loads(short.stdout), json.loads(long.stdout)
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 12 and a["seed"] == 5


@pytest.mark.parametrize("command,spellings", [
    ("generate", ["-m,--model", "-p,--prompt", "-n,--max-new-tokens", "--temperature,--temp", "-s,--seed", "-t,--threads"]),
    ("chat", ["-m,--model", "-p,--prompt", "-n,--max-new-tokens", "--temperature,--temp", "-s,--seed", "-t,--threads"]),
    ("serve", ["-m,--model", "-c,--ctx-size", "-t,--threads"]),
    ("perplexity", ["-m,--model", "-c,--context", "-t,--threads"]),
    ("explain", ["-m,--model", "-p,--prompt", "-t,--threads"]),
    ("tokenize", ["-m,--model", "-t,--threads"]),
    ("bench", ["-m,--model", "-t,--threads"]),
    ("quantize", ["-m,--model", "-t,--threads"]),
    ("attention", ["-s,--seed", "-t,--threads"]),
    ("train", ["-s,--seed", "-t,--threads"]),
])
def test_help_shows_the_short_spellings(command, spellings):
    r = run(command, "--help")
    assert r.returncode == 0
    for s in spellings:
        assert re.search(rf"^\s+{re.escape(s)}\b", r.stdout, re.M), (command, s)


def test_tokenize_takes_threads():
    r = run("tokenize", "-m", "kjv", "-t", "1", "Hi")
    assert r.returncode == 0 and r.stdout == "72 105\n", r.stderr


# ---- mistyped options and commands -----------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["generate", "--tmp", "0.5"], "unknown option --tmp; did you mean --temp?"),
    (["generate", "--top_k", "5"], "unknown option --top_k; did you mean --top-k?"),
    (["generate", "--max-new-token=5"], "unknown option --max-new-token; did you mean --max-new-tokens?"),
    (["chat", "--sytem", "Be brief."], "unknown option --sytem; did you mean --system?"),
    (["generate", "-p", "x", "--no-such-thing"], "unknown option --no-such-thing"),
    (["attention", "--bogus"], "unknown option --bogus"),
])
def test_an_unknown_option_is_named_with_the_nearest(args, message):
    usage_error(run(*args), message, args[0])


def test_a_negative_number_is_not_taken_for_an_option():
    usage_error(run("generate", "--presence-penalty", "-3"), "--presence-penalty: expected a number in [-2, 2], got -3",
                "generate")


def test_an_unknown_command_is_named_with_the_nearest():
    listed = ", ".join(COMMANDS[:-1]) + " or " + COMMANDS[-1]
    usage_error(run("chta"), f"unknown command 'chta': expected {listed}; did you mean chat?")
    usage_error(run("help", "genrate"), f"unknown command 'genrate': expected {listed}; did you mean generate?")
    usage_error(run("zzzzzz"), f"unknown command 'zzzzzz': expected {listed}")


# ---- help ------------------------------------------------------------------------------------------

def test_help_command():
    assert run("help").stdout == run("--help").stdout
    assert "Run 'mhsa help COMMAND'" in run("help").stdout
    for command in COMMANDS:
        assert f"\n  {command}" in run("help").stdout
    for command in ["generate", "chat", "tokenize"]:
        r = run("help", command)
        assert r.returncode == 0 and r.stdout == run(command, "--help").stdout
        assert r.stdout.startswith(f"{run(command, '--help').stdout.splitlines()[0]}")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_columns_are_aligned(command):
    """Every option whose name fits the column starts its description in the same column (CLI11
    pads by bytes: a multibyte "≥" among the names shifted the row)."""
    lines = run(command, "--help").stdout.splitlines()
    starts = set()
    for line in lines:
        m = re.match(r"^(  -\S.*?\S)(\s{2,})(\S)", line)
        if m and len(m.group(1)) < 28:
            starts.add(len(m.group(1)) + len(m.group(2)))
    assert len(starts) == 1, (command, starts)
    assert all(ord(c) < 128 for line in lines if line.startswith("  -") for c in line[:30]), command


# ---- seeds -----------------------------------------------------------------------------------------

def test_sampling_draws_a_seed_and_reports_it():
    runs = [run("generate", "-m", "kjv", "-p", "And", "-n", "16", "--temp", "1", "--json") for _ in range(2)]
    seeds = [json.loads(r.stdout)["seed"] for r in runs]
    assert seeds[0] != seeds[1]
    again = run("generate", "-m", "kjv", "-p", "And", "-n", "16", "--temp", "1", "-s", seeds[0], "--json")
    assert json.loads(again.stdout)["tokens"] == json.loads(runs[0].stdout)["tokens"]
    text = run("generate", "-m", "kjv", "-p", "And", "-n", "4", "--temp", "1")
    seed = re.search(r"^mhsa generate: seed (\d+) \(-s \1 repeats this run\)$", text.stderr, re.M)
    assert seed, text.stderr


def test_greedy_and_given_seeds_report_nothing_new():
    greedy = run("generate", "-m", "kjv", "-p", "And", "-n", "4")
    given = run("generate", "-m", "kjv", "-p", "And", "-n", "4", "--temp", "1", "-s", "3")
    assert "seed" not in greedy.stderr and "seed" not in given.stderr
    assert json.loads(run("generate", "-m", "kjv", "-p", "And", "-n", "4", "--json").stdout)["seed"] == 0


def test_chat_reports_its_drawn_seed():
    r = run(*KJV_CHAT, "-p", "Hi", "-n", "4", "--temp", "1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^mhsa chat: seed (\d+) \(-s \1 repeats this conversation\)$", r.stderr, re.M), r.stderr
    a = json.loads(run(*KJV_CHAT, "-p", "Hi", "-n", "8", "--temp", "1", "-s", "9", "--json").stdout)
    b = json.loads(run(*KJV_CHAT, "-p", "Hi", "-n", "8", "--temp", "1", "-s", "9", "--json").stdout)
    assert a["content"] == b["content"] and a["seed"] == 9


# ---- chat takes generate's sampling and stop options -----------------------------------------------

def option_names(command):
    """Every spelling in the option column ("--temp,--temperature FLOAT" gives both)."""
    names = set()
    for line in run(command, "--help").stdout.splitlines():
        if line.startswith("  -"):
            names.update(re.findall(r"--?[\w-]+", line.split()[0]))
    return names


def test_chat_takes_every_sampling_and_stop_option_of_generate():
    sampling = {"--max-new-tokens", "--temperature", "--temp", "--top-k", "--top-p", "--repetition-penalty",
                "--presence-penalty", "--frequency-penalty", "--logit-bias", "--seed", "--stop"}
    assert sampling <= option_names("generate")
    assert sampling <= option_names("chat")


def test_chat_stop_string_ends_the_answer():
    whole = json.loads(run(*KJV_CHAT, "-p", "Hi", "-n", "24", "--json").stdout)
    assert " " in whole["content"], whole
    cut = json.loads(run(*KJV_CHAT, "-p", "Hi", "-n", "24", "--stop", " ", "--json").stdout)
    assert cut["content"] == whole["content"][:whole["content"].index(" ")] and cut["finish_reason"] == "stop"
    printed = run(*KJV_CHAT, "-p", "Hi", "-n", "24", "--stop", " ")
    assert printed.stdout == cut["content"] + "\n", printed.stderr


def test_chat_logit_bias_and_penalties():
    banned = json.loads(run(*KJV_CHAT, "-p", "Hi", "-n", "30", "--logit-bias", "32=-100", "--presence-penalty", "1",
                            "--json").stdout)
    assert " " not in banned["content"] and banned["completion_tokens"] == 30
    input_error(run(*KJV_CHAT, "-p", "Hi", "--logit-bias", "x"),
                "--logit-bias: expected TOKEN_ID=BIAS (an integer id, a finite number), got 'x'")


# ---- edges -----------------------------------------------------------------------------------------

def test_max_new_tokens_past_the_context_stops_there_with_a_notice():
    r = run("generate", "-m", "kjv", "-p", "And", "-n", "600", "--no-echo")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == 512 - 3 + 1  # 509 bytes of text and the newline
    assert r.stderr.endswith("mhsa generate: stopped at the model's context of 512 tokens (3 prompt + 509 new; "
                             "-n asked for 600)\n"), r.stderr


def test_decoding_an_id_outside_the_vocabulary_is_an_error():
    input_error(run("tokenize", "-m", "kjv", "--decode", "72 300"),
                "TEXT: expected token ids below the vocabulary's size of 256, got 300")


# ---- messages in a CLI user's words ----------------------------------------------------------------

def test_a_missing_model_is_named_by_its_option():
    input_error(run("generate", "-m", "/nonexistent/model", "-p", "x"),
                "--model: expected a model directory (config.json, model.safetensors) or a GGUF file, "
                "got '/nonexistent/model'")
    input_error(run("generate", "-m", "kjv", "-p", "x", "--model-draft", "/nonexistent/model"),
                "--model-draft: expected a model directory (config.json, model.safetensors) or a GGUF file, "
                "got '/nonexistent/model'")
    input_error(run("bench", "-m", "/nonexistent/model"),
                "--model: expected a model directory (config.json, model.safetensors) or a GGUF file, "
                "got '/nonexistent/model'")
    input_error(run("train", "--data", "/nonexistent/text", "--out", "/nonexistent/run"),
                "--data: expected a readable file, got '/nonexistent/text': No such file or directory")
    input_error(run("tokenize", "-m", "/nonexistent/model", "x"),
                "--model: expected a directory, got '/nonexistent/model' (no such directory)")
    input_error(run("chat", "-m", "kjv", "-p", "x", "--stop", "x", "--messages", "/nonexistent"),
                "--prompt: expected either --prompt or --messages, got both")


@pytest.mark.parametrize("args", [
    ["generate", "-m", "/nonexistent/model", "-p", "x"],
    ["tokenize", "-m", "/nonexistent/model", "x"],
    ["chat", "-m", "kjv", "-p", "x"],
    ["chat", "-m", "kjv", "--chat-template", CHATML, "--messages", "/dev/null"],
    ["chat", "-m", "kjv", "--json"],
    ["explain", "-m", "kjv"],
    ["perplexity", "-m", "kjv", "-f", "/nonexistent"],
])
def test_errors_name_no_cxx_function_nor_mhsa_twice(args):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("mhsa: error: ") and not first.startswith("mhsa: error: mhsa"), first
    assert "::" not in first, first


# ---- interactive chat: line editing, history, /help ------------------------------------------------

def test_chat_edits_lines_and_keeps_history():
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(str(CLI), ["chat", "-t", "1", *map(str, KJV_CHAT[1:])], encoding="utf-8", timeout=30,
                          dimensions=(24, 200), env=ENV)
    child.expect_exact("> ")
    child.sendline("/help")
    child.expect_exact("/reset   start a new conversation (keeping --system)")
    child.expect_exact("> ")
    child.send("/resex\x7ft\r")  # Backspace
    child.expect_exact("mhsa chat: conversation cleared")
    child.expect_exact("> ")
    child.send("reset\x01/\r")  # Ctrl-A, then "/" at the start of the line
    child.expect_exact("mhsa chat: conversation cleared")
    child.expect_exact("> ")
    child.send("\x1b[A\r")  # Up: the line before
    child.expect_exact("mhsa chat: conversation cleared")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
