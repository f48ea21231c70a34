"""The README's Python examples run as pasted.

Every ```python block of README.md is executed in a fresh namespace, in the repository root,
except those that load a model from models/ other than the shipped default (the GPT-2 example needs
files downloaded from the hub, which these machines cannot reach: the GPT-2 tests cover that code
with checkpoints written by transformers). A block that raises fails the test with its number.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
NEEDS_HUB = re.compile(r"models/(?!default)")


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, monkeypatch):
    code = BLOCKS[index]
    if NEEDS_HUB.search(code):
        pytest.skip("needs a model downloaded from the hub")
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": f"readme_{index}"})
