"""The examples of the README and of the pages it sends users to (docs/usage.md, docs/api.md) run as pasted.

Every ```python block of those pages is executed in a fresh namespace, in the repository root,
except those that load a model from models/ other than the shipped default (the GPT-2 example needs
files downloaded from the hub, which these machines cannot reach: the GPT-2 tests cover that code
with checkpoints written by transformers) and those that talk to a running `mhsa serve`
(test_serve_apis.py runs the openai client against one). A block that raises fails the test with
its page and number.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/usage.md", "docs/api.md"]
TEXTS = {page: (ROOT / page).read_text() for page in PAGES}
BLOCKS = [(page, i, code) for page in PAGES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", TEXTS[page], re.S))]
NEEDS_HUB = re.compile(r"models/(?!default)")
NEEDS_SERVER = re.compile(r"base_url=")


def test_the_readme_has_python_examples():
    assert sum(page == "README.md" for page, _, _ in BLOCKS) >= 2
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("page, index, code", BLOCKS, ids=[f"{page}:{i}" for page, i, _ in BLOCKS])
def test_readme_python_block_runs(page, index, code, monkeypatch):
    if NEEDS_HUB.search(code):
        pytest.skip("needs a model downloaded from the hub")
    if NEEDS_SERVER.search(code):
        pytest.skip("talks to a running mhsa serve")
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"{page} python block {index}", "exec"), {"__name__": f"readme_{index}"})


# ---- the command lines of the README and its pages -----------------------------------------------------
#
# Every `build/mhsa ...` line of a ```sh block is split as bash splits it (quotes, $'...', comments)
# and checked against the command's --help: the command exists and every option it spells is one
# of that command's, and no prompt holds a backslash-n in quotes (bash sends both characters). Those
# that are quick and need nothing downloaded (the kjv model's, tokenizing) are also run, as
# written, and must succeed; the default model's (seconds each) are test_smollm2.py's.

import os
import subprocess

CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
SH_BLOCKS = [block for page in PAGES for block in re.findall(r"```sh\n(.*?)```", TEXTS[page], re.S)]
COMMAND_LINES = [line[line.index("build/mhsa "):] for block in SH_BLOCKS for line in block.replace("\\\n", " ").splitlines()
                 if "build/mhsa " in line]


def bash_words(line):
    """The words bash makes of `line` (after `build/mhsa`), its comment dropped."""
    r = subprocess.run(["bash", "-c", 'f() { printf "%s\\0" "$@"; }; f ' + line[len("build/mhsa "):]],
                       capture_output=True, check=True)
    return [w.decode() for w in r.stdout.split(b"\0")[:-1]]


def runs_here(words):
    """Quick and needing nothing downloaded: the kjv model or tokenizing, no server, file or terminal."""
    for option in ("--model", "-m"):
        if option in words and words[words.index(option) + 1] not in ("kjv", "smollm2"):
            if not (ROOT / words[words.index(option) + 1]).exists():  # downloaded or trained first
                return False
    cmd = words[0]
    if cmd == "tokenize":
        return True
    if "kjv" not in words:  # the default model's lines take seconds each: test_smollm2.py runs them
        return False
    if cmd == "explain":
        return "--format" in words and "--out" not in words
    if cmd in ("generate", "chat"):
        return "--prompt" in words or "-p" in words
    return False


def test_the_readme_has_command_lines():
    assert len(COMMAND_LINES) >= 20


@pytest.mark.parametrize("line", COMMAND_LINES)
def test_readme_command_line_is_valid(line):
    words = bash_words(line)
    for prompt_option in ("--prompt", "-p"):
        if prompt_option in words:  # a prompt with "\n" in quotes sends a backslash and an n
            assert "\\n" not in words[words.index(prompt_option) + 1], line
    help_text = subprocess.run([str(CLI), "help", words[0]], capture_output=True, text=True)
    assert help_text.returncode == 0, (line, help_text.stderr)
    spellings = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text.stdout))
    for w in words[1:]:
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", w):
            assert w.split("=")[0] in spellings, f"{line}: {w} is not an option of mhsa {words[0]}"
    if runs_here(words):
        env = {k: v for k, v in os.environ.items() if k != "MHSA_MODEL"}  # the default model, as a reader has it
        r = subprocess.run([str(CLI), *words], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert r.returncode == 0, (line, r.stderr)
        assert r.stdout.strip(), line
