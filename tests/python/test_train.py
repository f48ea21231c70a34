"""`mhsa train` run as a user runs it: it learns, a stopped run resumes bit for bit, Ctrl-C and
kill -9 never leave a broken checkpoint, and the checkpoint is a model `mhsa generate` and
Hugging Face transformers both load. (The gradients themselves are checked against PyTorch in
test_gpt2_train.py.)"""

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import safetensors

import mhsa
from cli_models import prose

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
SMALL = ["--layers", "2", "--heads", "2", "--embd", "32", "--context", "32", "--batch", "4", "--warmup", "5",
         "--eval-every", "10", "--checkpoint-every", "100"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Real prose: Debian's licence texts (~280 kB)."""
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(prose())
    return path


def train(*args, check=True, env=None):
    r = subprocess.run([str(CLI), "train", *map(str, args)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="2", **(env or {})))
    if check:
        assert r.returncode == 0, r.stderr
    return r


def state(out):
    with safetensors.safe_open(str(out / "train_state.safetensors"), "np") as f:
        meta = f.metadata()
        return json.loads(meta["history"]), int(meta["step"]), {k: f.get_tensor(k) for k in f.keys()}


def test_resume_repeats_an_uninterrupted_run_bit_for_bit(text, tmp_path, rng):
    seed = int(rng.integers(1000))
    train("--data", text, "--out", tmp_path / "whole", *SMALL, "--steps", 24, "--seed", seed)
    train("--data", text, "--out", tmp_path / "parts", *SMALL, "--steps", 24, "--seed", seed, "--stop-after", 9)
    assert state(tmp_path / "parts")[1] == 9
    r = train("--data", text, "--out", tmp_path / "parts", "--resume")
    assert "done at step 24" in r.stdout
    (ha, sa, ta), (hb, sb, tb) = state(tmp_path / "whole"), state(tmp_path / "parts")
    assert sa == sb == 24 and len(ha["loss"]) == 24
    assert ha == hb  # every step's loss and every validation, exactly
    assert ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)  # weights and AdamW moments


def test_train_log_records_every_step_and_a_resume_drops_what_the_checkpoint_lost(text, tmp_path, rng):
    """train_log.jsonl: one object per step (its loss equal to the checkpoint's history) and per
    validation. A run killed after its checkpoint logged steps the resume repeats, maybe a line cut
    short: the resume drops them, so each step appears once."""
    out, seed, lr = tmp_path / "m", int(rng.integers(1000)), float(rng.uniform(1e-3, 3e-3))
    train("--data", text, "--out", out, *SMALL, "--steps", 17, "--seed", seed, "--lr", lr, "--stop-after", 8)
    with open(out / "train_log.jsonl", "a") as f:  # what a run killed after step 9's line would leave
        f.write(json.dumps({"step": 9, "loss": 1.0}) + "\n" + '{"step": 10, "lo')
    train("--data", text, "--out", out, "--resume")
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    vals = [x for x in lines if "val_bpb" in x]
    history = state(out)[0]
    assert [x["step"] for x in steps] == list(range(1, 18))
    assert [x["loss"] for x in steps] == history["loss"]  # exactly: the shortest round-trip decimal
    assert [[x["step"], x["val_bpb"]] for x in vals] == history["val_bpb"]
    assert all(set(x) == {"step", "loss", "loss_bpb", "lr", "grad_norm", "tokens_per_s"} for x in steps)
    assert all(x["grad_norm"] > 0 and x["tokens_per_s"] > 0 for x in steps)
    warmup = [x["lr"] for x in steps[:5]]
    assert warmup == pytest.approx([lr * (s + 1) / 5 for s in range(5)], rel=1e-6)
    assert max(x["lr"] for x in steps) <= lr * (1 + 1e-6) and steps[-1]["lr"] < steps[5]["lr"]  # cosine decay


def test_training_learns_and_reports_progress(tmp_path):
    data = tmp_path / "abc.txt"  # a text a tiny model can learn: a repeated, slightly varied sentence
    data.write_text("".join(f"the cat sat on mat {i % 7}.\n" for i in range(3000)))
    r = train("--data", data, "--out", tmp_path / "m", *SMALL, "--steps", 150, "--lr", "3e-3")
    assert "step 150/150" in r.stderr and "tok/s" in r.stderr and "ETA" in r.stderr
    history, _, _ = state(tmp_path / "m")
    first, last = history["val_bpb"][0][1], history["val_bpb"][-1][1]
    assert last < 1.0 < first, (first, last)  # from ~8 bits per byte (uniform) to under 1
    svg = ET.parse(tmp_path / "m" / "loss_curve.svg").getroot()
    assert svg.tag.endswith("svg") and len(svg.findall(".//{http://www.w3.org/2000/svg}circle")) == 15
    # The checkpoint is a model directory: mhsa generates from it (bytes), continuing the pattern.
    g = subprocess.run([str(CLI), "generate", "--model", tmp_path / "m", "--prompt", "the cat sat on", "-n", "8",
                        "--json"], capture_output=True, text=True, check=True)
    assert json.loads(g.stdout)["text"].startswith(" mat")


def test_bpe_training_with_the_gpt2_tokenizer(text, tmp_path, rng):
    """--tokenizer: GPT-2's BPE vocabulary. The checkpoint carries the vocabulary files (a resumed
    run reads that copy: the original is gone by then), its validation in bits per byte equals
    bits per token of the held-out tokens × tokens / bytes recomputed here from the stored model,
    and mhsa generate runs it as a GPT-2 directory."""
    vocab = tmp_path / "vocab"
    shutil.copytree(ROOT / "tests" / "data" / "gpt2-tokenizer", vocab)
    out, seed = tmp_path / "bpe", int(rng.integers(1000))
    train("--data", text, "--out", out, "--tokenizer", vocab, *SMALL, "--steps", 20, "--seed", seed, "--stop-after", 10,
          "--val-fraction", "0.02")
    shutil.rmtree(vocab)
    r = train("--data", text, "--out", out, "--resume")
    assert "done at step 20" in r.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 50257 and config["eos_token_id"] == 50256 and config["mhsa_tokenizer"] == "gpt2"
    history, _, _ = state(out)
    reported = history["val_bpb"][-1][1]

    tok = mhsa.Tokenizer.load(str(out))
    data = text.read_bytes()
    held_out = data[len(data) - round(len(data) * 0.02):]
    ids = np.array(tok.encode(held_out))  # bytes: the cut may fall inside a character
    T = 32
    windows = (len(ids) - 1) // T
    use = min(windows, 8 * 4)  # the trainer's validation: eval_batches (8) x batch windows, spread evenly
    starts = [i * windows // use * T for i in range(use)]
    model = mhsa.GPT2.load(str(out))
    x = np.stack([ids[s:s + T] for s in starts])
    y = np.stack([ids[s + 1:s + T + 1] for s in starts])
    bits_per_token = model.loss(x, y) / np.log(2)
    assert reported == pytest.approx(bits_per_token * len(ids) / len(held_out), rel=1e-5)
    assert reported < 16  # below a uniform guess over 50257 tokens spread over the bytes: it learned something

    g = subprocess.run([str(CLI), "generate", "--model", out, "--prompt", "The model", "-n", "5", "--json"],
                       capture_output=True, text=True, check=True)
    assert len(json.loads(g.stdout)["tokens"]) == 5


def test_checkpoints_load_in_transformers(text, tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch
    train("--data", text, "--out", tmp_path, *SMALL, "--steps", 5)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ours = mhsa.GPT2.load(tmp_path)
    ids = np.frombuffer(b"Multi-head attention", np.uint8).astype(np.int64)[None]
    with torch.no_grad():
        want = hf(torch.as_tensor(ids)).logits.numpy()
    assert np.linalg.norm(ours.forward(ids) - want) / np.linalg.norm(want) <= 1e-4


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_runs_leave_a_loadable_checkpoint(text, tmp_path, sig, rng):
    """Ctrl-C writes the last finished step and exits; kill -9 at random moments (checkpoints every
    step, so often mid-write) leaves the previous checkpoint whole. Either way --resume goes on."""
    out = tmp_path / "m"
    train("--data", text, "--out", out, *SMALL, "--steps", 10 ** 6, "--stop-after", 1, "--checkpoint-every", 1)
    r = random.Random(int(rng.integers(1 << 30)))
    for _ in range(3 if sig == signal.SIGKILL else 1):
        p = subprocess.Popen([str(CLI), "train", "--data", str(text), "--out", str(out), "--resume"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="2"))
        time.sleep(r.uniform(0.8, 2.0))
        p.send_signal(sig)
        stdout, _ = p.communicate(timeout=120)
        if sig == signal.SIGINT:
            assert p.returncode == 0 and "interrupted at step" in stdout
        history, step, tensors = state(out)  # loads: never a torn file
        assert len(history["loss"]) == step and step >= 1
        mhsa.GPT2.load(out)
        assert not any(f.name.endswith(".tmp") for f in out.iterdir() if sig == signal.SIGINT)
    before = state(out)[1]
    train("--data", text, "--out", out, "--resume", "--stop-after", 2)
    assert state(out)[1] == before + 2


def full_disk_at(size):
    """For preexec_fn: writes past `size` bytes fail with EFBIG (a full disk, without root)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def test_a_full_disk_keeps_the_last_checkpoint(text, tmp_path):
    """A checkpoint that cannot be written (a file-size limit stands in for a full disk) ends the run
    as an output error (exit status 1) that names the step, the file and the reason and says which
    checkpoint is kept; that checkpoint's files are untouched, no temporary is left, and the run
    resumes from it once there is room."""
    out = tmp_path / "m"
    train("--data", text, "--out", out, *SMALL, "--steps", 20, "--stop-after", 3)
    files = {f.name: f.read_bytes() for f in out.iterdir() if f.name != "train_log.jsonl"}
    state_bytes = len(files["train_state.safetensors"])
    for size, says in [(state_bytes // 2, "expected room for the checkpoint of step 5 in "
                                          f"'{out}', got File too large writing train_state.safetensors; "
                                          "the checkpoint of step 3 is kept"),
                       (100, f"expected room to write '{out / 'train_log.jsonl'}', got File too large")]:
        r = subprocess.run([str(CLI), "train", "--data", str(text), "--out", str(out), "--resume", "--stop-after", "2"],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="2"),
                           preexec_fn=full_disk_at(size))
        assert r.returncode == 1 and f"mhsa: error: train: out: {says}\n" in r.stderr, r.stderr
        assert {f.name: f.read_bytes() for f in out.iterdir() if f.name in files} == files
        assert sorted(f.name for f in out.iterdir()) == sorted([*files, "train_log.jsonl"])
    train("--data", text, "--out", out, "--resume", "--stop-after", 2)
    assert state(out)[1] == 5
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2, 3, 4, 5]  # each step logged once


def test_bad_requests_are_clear_errors(text, tmp_path):
    r = train("--data", tmp_path / "missing.txt", "--out", tmp_path / "m", check=False)
    assert r.returncode == 2 and "data: expected a readable file" in r.stderr
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("too short")
    r = train("--data", tiny, "--out", tmp_path / "m", "--context", 64, check=False)
    assert r.returncode == 2 and ("expected at least 130 training and 65 validation tokens for a context of 64"
                                  in r.stderr) and "got 9 and 0 tokens from the 9 bytes" in r.stderr
    r = train("--data", text, "--out", tmp_path / "m", "--tokenizer", tmp_path, check=False)
    assert r.returncode == 2 and "vocab.json" in r.stderr  # a directory without vocabulary files
    # A tokenizer directory whose path is not UTF-8 (Linux allows it): the checkpoint's options are
    # JSON, so the path is refused up front, by name, before any step is lost.
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/tok\xff"))
    shutil.copytree(ROOT / "tests" / "data" / "gpt2-tokenizer", odd)
    r = train("--data", text, "--out", tmp_path / "odd", "--tokenizer", odd, check=False)
    assert r.returncode == 2 and "tokenizer: expected a directory path of valid UTF-8" in r.stderr, r.stderr
    assert "invalid UTF-8 at byte" in r.stderr and not (tmp_path / "odd").exists()
    r = train("--data", text, "--out", tmp_path / "m", "--resume", check=False)
    assert r.returncode == 2 and "--resume: expected a checkpoint in" in r.stderr
    r = train("--data", text, "--out", tmp_path / "m", "--embd", 30, "--heads", 4, check=False)
    assert r.returncode == 2 and "embd a multiple of heads" in r.stderr
