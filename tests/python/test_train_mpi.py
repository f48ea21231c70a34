"""`mpirun -np N mhsa train` (data-parallel training, docs/distributed.md): two ranks of one thread
over loopback TCP give the same bits as one process of two threads with the same global batch (each
step's loss, the weights and AdamW's moments), run after run; a checkpoint resumes with another
number of ranks; a rank that fails or dies ends the whole job and the last checkpoint stays
loadable; Ctrl-C on mpirun stops with a checkpoint; the buckets that overlap the reduction with
the backward change no bits. Skipped where mpirun is not installed or the build has no MPI (CI installs Open MPI)."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors

from cli_models import prose

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
MPIRUN = shutil.which("mpirun")


def built_with_mpi():
    cache = CLI.parent / "CMakeCache.txt"
    return cache.exists() and "MHSA_MPI:BOOL=ON" in cache.read_text()


pytestmark = pytest.mark.skipif(MPIRUN is None or not built_with_mpi(), reason="needs mpirun and an MPI build")

# Open MPI on one machine, any user, more ranks than cores, over loopback TCP only.
MPI = [MPIRUN or "mpirun", "--oversubscribe", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo",
       *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
SMALL = ["--layers", "2", "--heads", "2", "--embd", "32", "--context", "24", "--warmup", "3", "--eval-every", "4",
         "--checkpoint-every", "100"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(prose(100000))
    return path


def train(*args, ranks=0, check=True, threads=1, timeout=120):
    """ranks 0: one process with `threads` threads; else mpirun -np ranks, one thread each."""
    cmd = [*MPI, "-np", str(ranks)] if ranks else []
    r = subprocess.run([*cmd, str(CLI), "train", *map(str, args), "-t", str(threads)], capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if check:
        assert r.returncode == 0, r.stderr
    return r


def log(out):
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [(x["step"], x["loss"], x["grad_norm"], x["lr"]) for x in lines if "loss" in x], \
           [(x["step"], x["val_bpb"]) for x in lines if "val_bpb" in x]


def state(out):
    with safetensors.safe_open(str(out / "train_state.safetensors"), "np") as f:
        return int(f.metadata()["step"]), {k: f.get_tensor(k) for k in f.keys()}


def same_state(a, b):
    (sa, ta), (sb, tb) = state(a), state(b)
    return sa == sb and ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


def test_two_ranks_give_one_process_bits_run_after_run(text, tmp_path, rng):
    """An odd global batch (rows split 2/3 between the ranks), random seed and accumulation."""
    seed, batch, accumulate = int(rng.integers(1000)), int(rng.choice([3, 5])), int(rng.integers(1, 3))
    args = ["--data", text, *SMALL, "--steps", 6, "--seed", seed, "--batch", batch, "--accumulate", accumulate]
    train(*args, "--out", tmp_path / "one", threads=2)
    train(*args, "--out", tmp_path / "two", ranks=2)
    train(*args, "--out", tmp_path / "again", ranks=2)
    steps, vals = log(tmp_path / "one")
    assert len(steps) == 6 and len(vals) == 2
    assert log(tmp_path / "two") == log(tmp_path / "again") == (steps, vals)  # every loss and norm, exactly
    assert same_state(tmp_path / "one", tmp_path / "two") and same_state(tmp_path / "two", tmp_path / "again")


@pytest.mark.parametrize("arch", [[], ["--arch", "llama", "--kv-heads", "1", "--untied-head"]], ids=["gpt2", "llama"])
def test_reduction_buckets_overlapped_with_the_backward_change_no_bits(text, tmp_path, rng, arch):
    """One bucket after the backward (--bucket-mb 0), one per tensor (a few bytes), the default,
    and a random size: the same bits as one process, for 2 and 3 ranks (3: a rank's rows are two
    tree nodes). Llama with an untied head: its output matrix is final first, the embedding last."""
    args = ["--data", text, *SMALL, *arch, "--steps", 3, "--seed", int(rng.integers(1000)), "--batch", 5]
    train(*args, "--out", tmp_path / "one", threads=2)
    assert "comm_wait_s" not in (tmp_path / "one" / "train_log.jsonl").read_text()
    for ranks, mb in [(2, 0), (2, 1e-4), (3, 4), (3, float(rng.uniform(0.001, 0.02)))]:
        out = tmp_path / f"{ranks}-{mb}"
        train(*args, "--out", out, "--bucket-mb", mb, ranks=ranks)
        assert log(out) == log(tmp_path / "one") and same_state(out, tmp_path / "one"), (ranks, mb)
        waits = [json.loads(x).get("comm_wait_s") for x in (out / "train_log.jsonl").read_text().splitlines()]
        assert all(w >= 0 for w in waits if w is not None) and sum(w is not None for w in waits) == 3


def test_a_checkpoint_resumes_with_another_number_of_ranks(text, tmp_path, rng):
    args = ["--data", text, *SMALL, "--steps", 7, "--seed", int(rng.integers(1000)), "--batch", 4]
    train(*args, "--out", tmp_path / "whole", threads=2)
    train(*args, "--out", tmp_path / "2to1", "--stop-after", 3, ranks=2)
    train("--data", text, "--out", tmp_path / "2to1", "--resume")
    train(*args, "--out", tmp_path / "1to3", "--stop-after", 4)
    r = train("--data", text, "--out", tmp_path / "1to3", "--resume", ranks=3)
    assert r.stdout.count("done at step 7") == 1 and r.stderr.count("step 7/7") == 1  # rank 0 alone reports
    for out in ["2to1", "1to3"]:
        assert log(tmp_path / out) == log(tmp_path / "whole") and same_state(tmp_path / out, tmp_path / "whole")


def test_a_failing_rank_ends_the_job_and_the_checkpoint_stays(text, tmp_path):
    """Rank 1 alone cannot read its --data (mpirun's MPMD form): it says so and aborts the job, rank
    0 waiting in a collective included. Rank 1 given another --steps is refused by the check that
    every rank starts rank 0's run."""
    out = tmp_path / "m"
    args = [*SMALL, "--steps", 6, "--batch", 4]
    train("--data", text, "--out", out, *args, "--stop-after", 2, ranks=2)
    before = state(out)
    for rank1, says in [(["--data", tmp_path / "missing.txt"], "data: expected a readable file"),
                        (["--data", text, "--steps", 9], "rank 1 of 2: expected the run rank 0 starts (step 2 of")]:
        rank = [str(CLI), "train", "--out", str(out), "--resume", "-t", "1"]
        r = subprocess.run([*MPI, "-np", "1", *rank, "--data", str(text), ":", "-np", "1", *rank, *map(str, rank1)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "mhsa: error: rank 1 of 2: " in r.stderr and says in r.stderr, r.stderr
        after = state(out)
        assert after[0] == before[0] and all(np.array_equal(after[1][k], before[1][k]) for k in before[1])
    train("--data", text, "--out", out, "--resume", ranks=2)
    assert state(out)[0] == 6


def test_a_killed_rank_ends_the_job_and_the_checkpoint_stays(text, tmp_path):
    out = tmp_path / "m"
    p = subprocess.Popen([*MPI, "-np", "2", str(CLI), "train", "--data", str(text), "--out", str(out), *SMALL,
                          "--steps", str(10 ** 6), "--checkpoint-every", "2", "-t", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (out / "train_state.safetensors").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    victim = None
    for pid in filter(str.isdigit, os.listdir("/proc")):  # the process mpirun started as rank 1
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=1" in env and str(out).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            victim = int(pid)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode != 0 and "signal 9" in stderr, stderr
    step = state(out)[0]
    assert step >= 2
    train("--data", text, "--out", out, "--resume", "--steps", step + 2, ranks=2)
    assert state(out)[0] == step + 2


def test_ctrl_c_on_mpirun_stops_with_a_checkpoint(text, tmp_path):
    """mpirun passes SIGTERM to the ranks: rank 0's decision to stop is every rank's, and the
    checkpoint of the last finished step is written."""
    out = tmp_path / "m"
    p = subprocess.Popen([*MPI, "-np", "2", str(CLI), "train", "--data", str(text), "--out", str(out), *SMALL,
                          "--steps", str(10 ** 6), "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (out / "train_log.jsonl").exists() or not (out / "train_log.jsonl").read_text().count("\n") >= 3:
        assert time.time() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert "interrupted at step" in stdout, stderr
    step = int(stdout.split("interrupted at step ")[1].split(":")[0])
    assert state(out)[0] == step >= 3 and len(log(out)[0]) == step


def test_a_lora_run_gives_one_process_bits(text, tmp_path, rng):
    """mhsa train --model --lora-rank under mpirun -np 2 and 3, with buckets of a few tensors (each
    reduced as soon as the backward has it): one process's adapter and optimiser state, bit for
    bit. The adapter's gradients are lent to the backward and handed back as they become final."""
    import transformers
    from families import build
    base = tmp_path / "base"
    build(transformers.LlamaConfig, dict(vocab_size=50257, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
          transformers.LlamaForCausalLM, int(rng.integers(1000))).save_pretrained(base, safe_serialization=True)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(ROOT / "tests" / "data" / "gpt2-tokenizer" / name, base / name)
    args = ["--data", text, "--model", base, "--lora-rank", 3, "--context", 24, "--batch", 4, "--steps", 3,
            "--warmup", 1, "--lr", "1e-2", "--eval-every", 0, "--seed", int(rng.integers(1000))]
    train(*args, "--out", tmp_path / "one", threads=2)
    for ranks, bucket in ((2, "0.001"), (3, "0")):
        train(*args, "--out", tmp_path / f"r{ranks}", "--bucket-mb", bucket, ranks=ranks)
        assert same_state(tmp_path / "one", tmp_path / f"r{ranks}"), ranks
