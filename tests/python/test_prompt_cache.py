"""`mhsa serve`'s prompt cache beyond the KV pool (--prompt-cache-ram, --cache-dir): a prompt whose
blocks the pool has evicted is copied back from RAM, and after a restart from files, with the
answer `mhsa generate` gives (greedy) and the tokens counted in /metrics and in
usage.prompt_tokens_details.cached_tokens; files changed by a byte, truncated, replaced by another
model's or by a link are refused (logged), recomputed, and the answer is the same; another KV type
or weight type never reads them; --cache-dir-max holds; a directory others can write, or a file in
its place, is refused at start."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_models import write_gpt2_dir  # noqa: E402
from test_cli_serve import CLI, Server, generate, metric, rng, seed  # noqa: E402,F401 (rng, seed: fixtures)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_gpt2_dir(tmp_path_factory.mktemp("gpt2-prompt-cache"), seed=97)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):  # the same shapes, other weights
    return write_gpt2_dir(tmp_path_factory.mktemp("gpt2-prompt-cache-other"), seed=98)


ONE_TOKEN_WORDS = ["The", " quick", " brown", " fox", " over", " the", " lazy", " dog", " Hello", " world"]


def long_prompt(rng, tokens=90):
    """A prompt of `tokens` GPT-2 tokens (words of one token each): 5 whole 16-token blocks before its last."""
    return "".join(rng.choice(ONE_TOKEN_WORDS[1:]) if i else "The" for i in range(tokens))


def complete(s, prompt, n=6):
    r = s.client(timeout=120).completions.create(model=s.id, prompt=prompt, max_tokens=n, temperature=0)
    assert r.usage.prompt_tokens == len(prompt.split())
    details = r.usage.prompt_tokens_details
    return r.choices[0].text, (details.cached_tokens if details else 0)


def stop(s):
    assert s.stop() == 0
    return s.stderr()


def block_files(d):
    return sorted(Path(d).glob("*.kvc"), key=lambda p: p.stat().st_size)  # a prefix's first block first


def test_ram_tier_restores_what_the_pool_evicted(model_dir, rng):
    # 16 blocks of 16 tokens: three other prompts of ~100 tokens push the first one's blocks out of the pool.
    s = Server(model_dir, "--parallel", 1, "--kv-blocks", 16)
    try:
        first = long_prompt(rng)
        cold, cached = complete(s, first)
        assert cached == 0
        assert cold == generate(model_dir, first, 6)["text"]
        for _ in range(3):
            complete(s, long_prompt(rng))
        hits, tokens = metric(s, "mhsa_prompt_cache_ram_hits_total", "mhsa_prompt_cache_ram_tokens_total")
        again, cached = complete(s, first)
        assert again == cold
        assert metric(s, "mhsa_prompt_cache_ram_hits_total") == hits + 1
        assert metric(s, "mhsa_prompt_cache_ram_tokens_total") >= tokens + 64
        assert cached >= 64
        assert metric(s, "mhsa_prompt_cache_ram_bytes") > 0
    finally:
        stop(s)
    # Off: the same prompts prefill in full.
    s = Server(model_dir, "--parallel", 1, "--kv-blocks", 16, "--prompt-cache-ram", 0)
    try:
        assert complete(s, first)[0] == cold
        with pytest.raises(AttributeError):  # no prompt cache metrics at all
            metric(s, "mhsa_prompt_cache_ram_hits_total")
    finally:
        stop(s)


def test_restart_with_cache_dir_reuses_the_files(model_dir, tmp_path, rng):
    d = tmp_path / "cache"
    prompt = long_prompt(rng)
    s = Server(model_dir, "--cache-dir", d)
    try:
        cold, cached = complete(s, prompt)
        assert cached == 0
    finally:
        stop(s)
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    files = block_files(d)
    assert len(files) >= 5 and all(oct(f.stat().st_mode & 0o777) == "0o600" for f in files)
    s = Server(model_dir, "--cache-dir", d)
    try:
        again, cached = complete(s, prompt)
        assert again == cold == generate(model_dir, prompt, 6)["text"]
        assert cached >= 16 * len(files) - 16 and cached >= 64
        assert metric(s, "mhsa_prompt_cache_disk_hits_total") == 1
        assert metric(s, "mhsa_prompt_cache_disk_tokens_total") == cached
        assert metric(s, "mhsa_prompt_cache_disk_refused_total") == 0
        # Now in RAM and in the pool: the third time takes it from the pool.
        assert complete(s, prompt) == (cold, cached)
    finally:
        stop(s)
    # Another KV type or weight type names other files: none of these is read.
    for args in (["--kv-dtype", "bf16"], ["--dtype", "bf16"]):
        s = Server(model_dir, "--cache-dir", d, *args)
        try:
            assert complete(s, prompt)[1] == 0
            assert metric(s, "mhsa_prompt_cache_disk_hits_total", "mhsa_prompt_cache_disk_refused_total") == [0, 0]
        finally:
            stop(s)


def test_bad_files_are_refused_and_recomputed(model_dir, other_model_dir, tmp_path, rng):
    d, other = tmp_path / "cache", tmp_path / "other"
    prompt = long_prompt(rng)
    s = Server(model_dir, "--cache-dir", d)
    try:
        cold = complete(s, prompt)[0]
    finally:
        stop(s)
    s = Server(other_model_dir, "--cache-dir", other)  # the same prompt's blocks from another model
    try:
        complete(s, prompt)
    finally:
        stop(s)
    mine, theirs = block_files(d), block_files(other)
    assert len(mine) == len(theirs) >= 5

    def damage(how):
        """Changes the first block's file as `how` says; returns what the server logs about it."""
        f = block_files(d)[0]
        if how == "byte":
            b = bytearray(f.read_bytes())
            b[len(b) // 2] ^= 0x40
            f.write_bytes(bytes(b))
        elif how == "truncated":
            f.write_bytes(f.read_bytes()[:-100])
        elif how == "empty":
            f.write_bytes(b"")
        elif how == "huge length":  # the token count's field: far more than the file holds
            b = bytearray(f.read_bytes())
            b[80:88] = (1 << 62).to_bytes(8, "little")
            f.write_bytes(bytes(b))
        elif how == "other model":
            shutil.copy(block_files(other)[0], f)
        elif how == "link":
            target = tmp_path / "elsewhere"
            shutil.copy(f, target)
            f.unlink()
            f.symlink_to(target)
        return f

    for how in ["byte", "truncated", "empty", "huge length", "other model", "link"]:
        f = damage(how)
        s = Server(model_dir, "--cache-dir", d)
        try:
            text, cached = complete(s, prompt)
            assert text == cold, how
            assert cached == 0, how  # the first block refused: nothing after it is used
            assert metric(s, "mhsa_prompt_cache_disk_refused_total") == 1, how
        finally:
            log = stop(s)
        assert re.search(rf"prompt cache: refused {f.name}: ", log), (how, log)
        # Recomputed and written again: the next start reads it all.
        s = Server(model_dir, "--cache-dir", d)
        try:
            assert complete(s, prompt)[0] == cold
            assert metric(s, "mhsa_prompt_cache_disk_refused_total") == 0, how
            assert metric(s, "mhsa_prompt_cache_disk_hits_total") == 1, how
        finally:
            stop(s)
    assert (tmp_path / "elsewhere").exists()  # a link is removed, never what it points to


def test_cache_dir_max_holds(model_dir, tmp_path, rng):
    d = tmp_path / "cache"
    s = Server(model_dir, "--cache-dir", d, "--cache-dir-max", 1)
    try:
        for _ in range(30):  # ~6 blocks of ~8.5 KB each: ~1.5 MB written in all
            complete(s, long_prompt(rng), n=1)
        written, evicted = metric(s, "mhsa_prompt_cache_disk_written_bytes_total", "mhsa_prompt_cache_disk_evicted_total")
    finally:
        stop(s)
    assert written > 1 << 20 and evicted > 0
    assert 0 < sum(f.stat().st_size for f in Path(d).iterdir()) <= 1 << 20


def test_cache_dir_refused_at_start(model_dir, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for d, why in [(open_dir, "writable by its group or others"), (a_file, "")]:
        r = subprocess.run([str(CLI), "serve", "--model", str(model_dir), "--port", "0", "--cache-dir", str(d)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert "--cache-dir: expected a directory of yours that no one else can write" in r.stderr, r.stderr
        assert why in r.stderr
