"""`mhsa train` never loses work: it refuses to replace a checkpoint it was not asked to, stops a
diverging run before it saves non-finite weights, refuses nonsensical options, distrusts what a
checkpoint says about itself, keeps one trainer per directory and shows readers one checkpoint
whole, finds an unwritable --out before the first step, cleans a killed run's temporaries, refuses
to resume on other text unless asked, and warns when --steps ends inside the warm-up. Tiny models,
a few steps: each test takes seconds."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import mhsa

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
TINY = ["--layers", "1", "--heads", "2", "--embd", "16", "--context", "16", "--batch", "2", "--warmup", "1",
        "--eval-every", "0"]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "cat.txt"
    path.write_text("".join(f"the cat sat on mat {i % 7}.\n" for i in range(800)))
    return path


def train(*args, timeout=120):
    return subprocess.run([str(CLI), "train", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def state(out):
    with safetensors.safe_open(str(out / "train_state.safetensors"), "np") as f:
        return int(f.metadata()["step"]), {k: f.get_tensor(k) for k in f.keys()}


def config(out):
    return json.loads((out / "config.json").read_text())


def test_a_new_run_does_not_replace_a_checkpoint_unless_forced(text, tmp_path):
    out = tmp_path / "m"
    vocab = ROOT / "tests" / "data" / "gpt2-tokenizer"
    assert train("--data", text, "--out", out, *TINY, "--layers", 2, "--steps", 3, "--tokenizer", vocab).returncode == 0
    r = train("--data", text, "--out", out, *TINY, "--steps", 3)
    assert r.returncode == 2 and "--force replaces it" in r.stderr and f"'{out}' holding" in r.stderr, r.stderr
    assert config(out)["n_layer"] == 2 and state(out)[0] == 3  # untouched
    r = train("--data", text, "--out", out, *TINY, "--steps", 3, "--force")
    assert r.returncode == 0, r.stderr
    # The new byte-level model replaced the whole BPE checkpoint: no vocabulary file of the old one
    # is left for `mhsa generate` to pick up.
    assert config(out)["n_layer"] == 1 and config(out)["vocab_size"] == 256
    assert not (out / "vocab.json").exists() and not (out / "merges.txt").exists()
    g = subprocess.run([str(CLI), "generate", "--model", out, "--prompt", "the cat", "-n", "4"], capture_output=True)
    assert g.returncode == 0, g.stderr


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(text, tmp_path):
    out = tmp_path / "m"
    r = train("--data", text, "--out", out, *TINY, "--steps", 20, "--lr", 100, "--checkpoint-every", 1)
    assert r.returncode == 2 and "done" not in r.stdout, (r.returncode, r.stdout)
    # Stopped by an exploding loss (10x a uniform guess) or, had it got there first, a non-finite one.
    assert ("expected a finite loss and gradient norm" in r.stderr
            or "expected a loss below 10x that of a uniform guess" in r.stderr), r.stderr
    assert "the run diverged" in r.stderr, r.stderr
    step, tensors = state(out)
    assert 1 <= step < 20 and f"the checkpoint of step {step} in '{out}' is kept" in r.stderr
    assert all(np.isfinite(t).all() for t in tensors.values())
    assert np.isfinite(mhsa.GPT2.load(out).forward(np.arange(8)[None])).all()  # finite weights, and a finite model
    # --lr 1e30 gives finite weights near 1e30 after one step, which give NaN: never saved, not even
    # over the checkpoint a --force run would replace.
    r = train("--data", text, "--out", out, *TINY, "--steps", 20, "--lr", "1e30", "--checkpoint-every", 1, "--force")
    assert r.returncode == 2 and "no checkpoint of this run was written" in r.stderr, r.stderr
    assert state(out)[0] == step
    g = subprocess.run([str(CLI), "generate", "--model", out, "--prompt", "the cat", "-n", "4"], capture_output=True)
    assert g.returncode == 0, g.stderr


@pytest.mark.parametrize("option,value,says", [
    ("--lr", "nan", "--lr: expected a number > 0, got nan"),  # the CLI's check (the library's is the same rule)
    ("--lr", "inf", "--lr"),  # CLI11's range check refuses inf first
    ("--lr", "-1", "lr"),
    ("--weight-decay", "nan", "weight_decay: expected a finite number >= 0, got nan"),
    ("--weight-decay", "-0.1", "weight_decay: expected a finite number >= 0, got -0.1"),
    ("--clip", "nan", "--clip: expected a number \u2265 0, got nan"),
    ("--clip", "inf", "--clip"),
    ("--eval-every", "-1", "eval_every: expected a count >= 0 (0: none), got -1"),
    ("--checkpoint-every", "-5", "checkpoint_every: expected a count >= 0 (0: none), got -5"),
    ("--val-fraction", "nan", "val_fraction: expected a finite number in (0, 0.5), got nan"),
])
def test_nonsensical_options_are_refused_before_any_work(text, tmp_path, option, value, says):
    r = train("--data", text, "--out", tmp_path / "m", *TINY, "--steps", 2, option, value)
    assert r.returncode != 0 and says in r.stderr and "step 1/" not in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.parametrize("key,value", [("n_embd", 32), ("n_layer", 2), ("n_head", 1), ("vocab_size", 300)])
def test_resume_checks_the_checkpoint_against_its_config(text, tmp_path, key, value):
    out = tmp_path / "m"
    assert train("--data", text, "--out", out, *TINY, "--steps", 4, "--stop-after", 2).returncode == 0
    edited = dict(config(out), **{key: value})
    (out / "config.json").write_text(json.dumps(edited))
    r = train("--data", text, "--out", out, "--resume")
    assert r.returncode == 2 and "config.json: expected the shape of train_state.safetensors" in r.stderr, \
        (r.returncode, r.stderr)


@pytest.mark.parametrize("tensor", ["param.wte.weight", "adam_m.h.0.mlp.c_fc.weight", "adam_v.ln_f.bias"])
def test_resume_checks_every_tensor_of_the_train_state(text, tmp_path, tensor):
    out = tmp_path / "m"
    assert train("--data", text, "--out", out, *TINY, "--steps", 4, "--stop-after", 2).returncode == 0
    file = out / "train_state.safetensors"
    with safetensors.safe_open(str(file), "np") as f:
        meta = f.metadata()
    tensors = safetensors.numpy.load_file(str(file))
    tensors[tensor] = np.zeros(tensors[tensor].shape[:-1] + (tensors[tensor].shape[-1] + 3,), np.float32)
    safetensors.numpy.save_file(tensors, str(file), metadata=meta)
    r = train("--data", text, "--out", out, "--resume")
    assert r.returncode == 2 and f"tensor '{tensor}': expected shape" in r.stderr and "(the model's)" in r.stderr, \
        (r.returncode, r.stderr)


def test_a_second_trainer_on_one_directory_is_refused(text, tmp_path):
    out = tmp_path / "m"
    first = subprocess.Popen([str(CLI), "train", "--data", str(text), "--out", str(out), *TINY, "--steps", str(10 ** 6),
                              "--checkpoint-every", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 60
        while not (out / "train_state.safetensors").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for how in (["--resume"], [*TINY, "--force"]):
            r = train("--data", text, "--out", out, *how, "--stop-after", 2, "--steps", 10 ** 6)
            assert r.returncode == 2, (r.returncode, r.stderr)
            assert f"'{out}' in use by process {first.pid}" in r.stderr and "train.lock" in r.stderr, r.stderr
    finally:
        first.send_signal(signal.SIGINT)
        stdout, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and "interrupted at step" in stdout
    step, _ = state(out)
    assert train("--data", text, "--out", out, "--resume", "--stop-after", 1).returncode == 0  # the lock is free again
    assert state(out)[0] == step + 1


FORCE = ["--force"]


def test_readers_see_one_checkpoint_whole(text, tmp_path):
    """Runs of two shapes replace each other's checkpoint (--force) while this process loads the
    directory as fast as it can: every load sees the config.json and model.safetensors of one
    checkpoint (never a 2-layer config with 1-layer weights)."""
    out = tmp_path / "m"
    shapes = [["--layers", 1, "--embd", 16], ["--layers", 2, "--embd", 32]]
    assert train("--data", text, "--out", out, *TINY, "--steps", 1).returncode == 0
    writers_done, codes = threading.Event(), []

    def writers():
        for i in range(24):
            codes.append(train("--data", text, "--out", out, *TINY, *shapes[i % 2], "--steps", 2,
                               "--checkpoint-every", 1, *FORCE).returncode)
        writers_done.set()

    thread = threading.Thread(target=writers)
    thread.start()
    loads, failures = 0, []
    while not writers_done.is_set():
        try:
            model = mhsa.GPT2.load(out)
            assert model.config["n_layer"] in (1, 2)
        except Exception as e:  # noqa: BLE001 -- every failure is the finding
            failures.append(str(e))
        loads += 1
    thread.join()
    assert codes == [0] * 24
    assert not failures, f"{len(failures)} of {loads} loads failed, e.g. {failures[0]}"
    assert loads >= 24


def test_an_unwritable_out_is_refused_before_the_first_step(text, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = train("--data", text, "--out", blocker / "m", *TINY, "--steps", 3, "--checkpoint-every", 0)
    assert r.returncode == 2 and "out: expected a writable directory" in r.stderr and "step 1/" not in r.stderr, \
        (r.returncode, r.stderr)
    if os.geteuid() != 0:  # root writes into a read-only directory anyway
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o555)
        r = train("--data", text, "--out", locked, *TINY, "--steps", 3, "--checkpoint-every", 0)
        assert r.returncode == 2 and "out: expected a writable directory" in r.stderr and "step 1/" not in r.stderr


@pytest.mark.parametrize("name", ["loss_curve.svg", "train_log.jsonl"])
def test_a_node_in_place_of_a_checkpoint_file_is_refused_before_the_first_step(text, tmp_path, name):
    """A checkpoint renames its files into place, which would replace a FIFO or device under one of
    their names with a regular file: refused before any step, the node left as it was."""
    out = tmp_path / "m"
    out.mkdir()
    os.mkfifo(out / name)
    r = train("--data", text, "--out", out, *TINY, "--steps", 3, "--checkpoint-every", 1)
    assert r.returncode == 2 and "step 1/" not in r.stderr, (r.returncode, r.stderr)
    assert (f"train: out: expected a regular file or a path that does not exist (a new file is renamed into "
            f"place), got a FIFO '{out / name}'") in r.stderr, r.stderr
    assert (out / name).is_fifo() and sorted(p.name for p in out.iterdir()) == [name]


def test_a_killed_runs_temporaries_are_removed(text, tmp_path):
    out = tmp_path / "m"
    assert train("--data", text, "--out", out, *TINY, "--steps", 4, "--stop-after", 1).returncode == 0
    stale = ["model.safetensors.tmp.999999999", "train_state.safetensors.tmp.7.tmp.7", "config.json.tmp",
             "loss_curve.svg.tmp.12"]
    for name in stale:
        (out / name).write_bytes(b"half a file")
    (out / "notes.tmp.1").write_text("a user's file")
    assert train("--data", text, "--out", out, "--resume", "--stop-after", 1).returncode == 0
    assert sorted(p.name for p in out.iterdir() if ".tmp" in p.name) == ["notes.tmp.1"]


def test_resume_refuses_other_text_unless_asked(text, tmp_path):
    out, other = tmp_path / "m", tmp_path / "other.txt"
    other.write_text("".join(f"a dog ran to the park {i % 5}!\n" for i in range(700)))
    assert train("--data", text, "--out", out, *TINY, "--steps", 6, "--stop-after", 2).returncode == 0
    r = train("--data", other, "--out", out, "--resume")
    assert r.returncode == 2 and "--allow-data-change" in r.stderr and f"{text.stat().st_size} bytes" in r.stderr, \
        r.stderr
    assert state(out)[0] == 2
    assert train("--data", other, "--out", out, "--resume", "--allow-data-change", "--stop-after", 2).returncode == 0
    assert train("--data", other, "--out", out, "--resume").returncode == 0  # the checkpoint now names the new text
    assert state(out)[0] == 6


def test_a_run_shorter_than_its_warmup_is_warned_about(text, tmp_path):
    r = train("--data", text, "--out", tmp_path / "a", *TINY, "--steps", 3, "--warmup", 10, "--lr", "1e-3")
    assert r.returncode == 0 and "warning: --steps 3 ends within the --warmup of 10 steps" in r.stderr, r.stderr
    assert "rises only to 3.00e-04, not the --lr 1.00e-03 given" in r.stderr
    r = train("--data", text, "--out", tmp_path / "b", *TINY, "--steps", 3, "--warmup", 3)
    assert r.returncode == 0 and "warning" not in r.stderr


def lrs(out):
    return {x["step"]: x["lr"] for x in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()) if "lr" in x}


def test_resume_with_other_steps_keeps_the_schedule(text, tmp_path, rng):
    """--resume --steps N ends the run at N but keeps the checkpoint's warm-up + cosine: the learning
    rate goes on as in the uninterrupted run (no jump at the resume), and steps past the schedule's
    end train at lr × min_lr_ratio; a note says so."""
    lr, warmup, steps, longer = 1e-3, int(rng.integers(1, 4)), 10, 16
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train("--data", text, "--out", whole, *TINY, "--steps", steps, "--warmup", warmup, "--lr", lr).returncode == 0
    assert train("--data", text, "--out", cut, *TINY, "--steps", steps, "--warmup", warmup, "--lr", lr,
                 "--stop-after", 4).returncode == 0
    r = train("--data", text, "--out", cut, "--resume", "--steps", longer)
    assert r.returncode == 0, r.stderr
    assert f"note: --steps {longer} keeps the checkpoint's learning-rate schedule of {steps} steps" in r.stderr
    expected = {s: lr * s / warmup if s <= warmup else
                lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1, (s - 1 - warmup) / (steps - warmup)))))
                for s in range(1, longer + 1)}
    got = lrs(cut)
    assert sorted(got) == list(range(1, longer + 1))
    assert [got[s] for s in range(1, steps + 1)] == [lrs(whole)[s] for s in range(1, steps + 1)]
    assert got == pytest.approx(expected, rel=1e-6)
    assert state(cut)[0] == longer
    # A second resume with yet another --steps still keeps the first run's schedule.
    r = train("--data", text, "--out", cut, "--resume", "--steps", longer + 2)
    assert r.returncode == 0 and lrs(cut)[longer + 2] == pytest.approx(lr * 0.1, rel=1e-6), r.stderr


def test_a_resumed_run_inside_its_warmup_is_warned_about_too(text, tmp_path):
    out = tmp_path / "m"
    assert train("--data", text, "--out", out, *TINY, "--steps", 4, "--warmup", 10, "--stop-after", 1).returncode == 0
    r = train("--data", text, "--out", out, "--resume")
    assert r.returncode == 0 and "warning: --steps 4 ends within the --warmup of 10 steps" in r.stderr, r.stderr


def test_the_lock_file_goes_when_the_run_ends(text, tmp_path):
    out = tmp_path / "m"
    assert train("--data", text, "--out", out, *TINY, "--steps", 3).returncode == 0
    assert not (out / "train.lock").exists()
    assert train("--data", text, "--out", out, "--resume", "--steps", 6, "--stop-after", 1).returncode == 0
    assert not (out / "train.lock").exists() and state(out)[0] == 4


def test_the_loss_curve_puts_each_point_at_its_step(text, tmp_path):
    """loss_curve.svg: a validation point sits on the training curve's x of its step (the last one at
    the axis's end, not past it), and the step axis has tick labels at those x."""
    import xml.etree.ElementTree as ET
    out, steps = tmp_path / "m", 12
    assert train("--data", text, "--out", out, *TINY, "--steps", steps, "--eval-every", 4).returncode == 0
    ns = "{http://www.w3.org/2000/svg}"
    svg = ET.parse(out / "loss_curve.svg").getroot()
    xs = [float(p.split(",")[0]) for p in svg.find(f"{ns}polyline").get("points").split()]
    assert len(xs) == steps
    grid_right = max(float(line.get("x2")) for line in svg.iter(f"{ns}line"))
    circles = [float(c.get("cx")) for c in svg.iter(f"{ns}circle")]
    assert circles == pytest.approx([xs[3], xs[7], xs[11]]) and max(circles) <= grid_right
    plot_bottom = max(float(line.get("y1")) for line in svg.iter(f"{ns}line") if line.get("y1") == line.get("y2"))
    ticks = {int(t.text): float(t.get("x")) for t in svg.iter(f"{ns}text")
             if t.text and t.text.isdigit() and float(t.get("y")) > plot_bottom}
    assert len(ticks) >= 3 and steps in ticks
    for step, x in ticks.items():
        assert x == pytest.approx(xs[step - 1])
