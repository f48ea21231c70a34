"""Python threads sharing mhsa objects. The module releases the GIL while it computes, so threads
really run at once: calls on one object must still give the serial results (the bindings lock an
object while a call changes it), and calls on different objects must still overlap.

Each case runs in a subprocess, so that a crash (a segfault, heap corruption) fails the test
instead of killing pytest; OMP_NUM_THREADS=1 keeps the threads from crowding a small machine.
Under ThreadSanitizer (a module built with -fsanitize=thread, run with LD_PRELOAD=libtsan.so.2)
these cases report no race in mhsa's code; the one report left is glibc's TLS of a finished
thread (a thread_local GEMM buffer's destructor) reused by a new thread, a known false positive.
"""

import os
import subprocess
import sys
import textwrap

import pytest

TOKENIZER_DIR = os.path.join(os.path.dirname(__file__), "..", "data", "gpt2-tokenizer")

# Imported by every case: hammer(n, fn) runs fn(i) on n threads started together and re-raises the
# first exception any of them raised.
PRELUDE = """
import threading, time
import numpy as np
import mhsa

def hammer(n, fn):
    barrier = threading.Barrier(n)
    errors = []
    def run(i):
        try:
            barrier.wait()
            fn(i)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
"""


def run_isolated(code, timeout=120):
    """Runs PRELUDE + code in a fresh interpreter with this one's module path; fails on a crash."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no result within {timeout} s (a deadlock?)")
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
    assert proc.returncode == 0, f"the threads' process ended with {how}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_forward_and_backward_of_one_layer_on_two_threads():
    # Was a segfault in 5 runs of 5: backward read the tape while a forward replaced it.
    run_isolated("""
        rng = np.random.default_rng(0)
        m = mhsa.MultiHeadAttention(64, 4, seed=1)
        x = rng.standard_normal((2, 48, 64), dtype=np.float32)
        dy = rng.standard_normal((2, 48, 64), dtype=np.float32)
        rounds = 200
        serial = mhsa.MultiHeadAttention(64, 4, seed=1)
        y0 = serial(x, is_causal=True, requires_grad=True)
        dx0 = [serial.backward(dy) for _ in range(rounds)][0]
        m(x, is_causal=True, requires_grad=True)
        def work(i):
            for _ in range(rounds):
                if i == 0:
                    assert np.array_equal(m(x, is_causal=True, requires_grad=True), y0)
                else:
                    assert np.array_equal(m.backward(dy), dx0)
        hammer(2, work)
        for k, g in m.grads.items():  # `rounds` backward calls, each adding the same gradient
            assert np.array_equal(g, serial.grads[k]), k
    """)


def test_steps_on_one_cache_from_four_threads():
    # Was heap corruption: four threads appended to one cache at once. The same token every step
    # makes every step's result the same whatever the order: attention over identical keys.
    run_isolated("""
        rng = np.random.default_rng(0)
        m = mhsa.MultiHeadAttention(64, 4, seed=1)
        x = rng.standard_normal((2, 1, 64), dtype=np.float32)
        alone = m.new_cache(2, 1)
        y0 = m.step(x, alone)
        steps = 60
        cache = m.new_cache(2, 4 * steps)
        writing = threading.Semaphore(0)
        def work(i):
            if i == 4:  # a reader, while the others write
                for _ in range(4):
                    while not writing.acquire(blocking=False):
                        assert cache.keys.shape[2] <= len(cache) <= cache.capacity  # length only grows
                return
            try:
                for _ in range(steps):  # attention over equal keys: y0 again, up to roundings
                    np.testing.assert_allclose(m.step(x, cache), y0, rtol=1e-5, atol=1e-5)
            finally:
                writing.release()
        hammer(5, work)
        assert cache.length == 4 * steps
        assert np.array_equal(cache.keys, np.repeat(alone.keys, 4 * steps, axis=2))
        assert np.array_equal(cache.values, np.repeat(alone.values, 4 * steps, axis=2))
    """)


def test_layer_calls_gradients_and_parameters_from_many_threads():
    # Every kind of call on one layer at once: forward with and without a tape, cross-attention
    # over an array and over a projected memory, backward, zero_grad, parameter writes, steps.
    run_isolated("""
        rng = np.random.default_rng(0)
        m = mhsa.MultiHeadAttention(32, 4, seed=1)
        x = rng.standard_normal((2, 8, 32), dtype=np.float32)
        mem = rng.standard_normal((2, 5, 32), dtype=np.float32)
        y0, y_cross = m(x), m(x, memory=mem)
        projected = m.project_memory(mem)
        w = m.w_o.copy()
        def work(i):
            for _ in range(150):
                if i == 0:
                    assert np.array_equal(m(x), y0)
                elif i == 1:
                    np.testing.assert_allclose(m(x, memory=projected), y_cross, rtol=1e-5, atol=1e-6)
                elif i == 2:
                    m(x, memory=mem, requires_grad=True)
                    m.backward(x)
                elif i == 3:
                    m.zero_grad()
                    m.grads
                elif i == 4:
                    m.w_o = w  # the same values: results stay the same
                else:
                    cache = m.new_cache(2, 8)
                    m.step(x, cache)
                    cache.reset()
        hammer(6, work)
    """)


def test_gpt2_model_and_cache_shared_by_threads():
    # A GPT2 is read-only: forward, generate, loss_and_grad run on it at once. A GPT2Cache is
    # extended by four threads; each extension must be one of the positions a serial run gives.
    run_isolated("""
        g = mhsa.GPT2.random(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2, seed=3)
        ids = np.arange(12, dtype=np.int64).reshape(2, 6) % 64
        targets = (ids + 1) % 64
        logits0, gen0 = g.forward(ids), g.generate(ids, 8)
        loss0, grads0 = g.loss_and_grad(ids, targets)
        token = np.array([[5], [7]])
        steps = 10
        serial = g.new_cache(2, 4 * steps)
        expected = [g.extend(serial, token) for _ in range(4 * steps)]
        cache = g.new_cache(2, 4 * steps)
        positions = []
        def work(i):
            for _ in range(steps):
                if i < 4:
                    out = g.extend(cache, token)
                    diffs = [np.abs(out - e).max() for e in expected]
                    assert min(diffs) < 1e-5, min(diffs)
                    positions.append(int(np.argmin(diffs)))
                elif i == 4:
                    np.testing.assert_allclose(g.forward(ids), logits0, rtol=1e-5, atol=1e-5)
                elif i == 5:
                    assert np.array_equal(g.generate(ids, 8), gen0)
                else:
                    loss, grads = g.loss_and_grad(ids, targets)
                    assert abs(loss - loss0) < 1e-5
                    np.testing.assert_allclose(grads["wte.weight"], grads0["wte.weight"], rtol=1e-4, atol=1e-6)
        hammer(7, work)
        assert cache.length == 4 * steps
        assert sorted(positions) == list(range(4 * steps))
    """)


def test_tokenizer_shared_by_threads():
    run_isolated(f"""
        t = mhsa.Tokenizer.load({TOKENIZER_DIR!r})
        texts = [f"Thread {{i}} says hello, world! {{'ab' * i}} 123 caf\\u00e9" for i in range(40)]
        serial = [t.encode(s) for s in texts]
        def work(i):
            for _ in range(20):
                for s, ids in zip(texts, serial):
                    assert t.encode(s) == ids
                    assert t.decode(ids) == s
        hammer(4, work)
    """)


def test_calls_on_different_objects_run_at_once():
    # The locks are per object: short calls on a second layer (and read-only calls on the first)
    # finish while a long call on the first layer still runs. A lock shared by all objects would
    # make them wait for it. (A thread that is late to start can only make this pass, not fail.)
    out = run_isolated("""
        rng = np.random.default_rng(0)
        big, small = mhsa.MultiHeadAttention(256, 4, seed=1), mhsa.MultiHeadAttention(32, 4, seed=2)
        x_big = rng.standard_normal((2, 4096, 256), dtype=np.float32)
        x_small = rng.standard_normal((1, 4, 32), dtype=np.float32)
        x_read = rng.standard_normal((1, 4, 256), dtype=np.float32)
        started, done = threading.Event(), {}
        def work(i):
            if i == 0:
                done["start"] = time.perf_counter()
                started.set()
                big(x_big, is_causal=True)
                done["long"] = time.perf_counter()
            else:
                started.wait()
                time.sleep(0.05)  # let the long call get going
                for _ in range(5):
                    small(x_small)
                    small.step(x_small, small.new_cache(1, 4))
                    big(x_read)  # reads share the layer
                done["short"] = time.perf_counter()
        hammer(2, work)
        long_s, short_s = done["long"] - done["start"], done["short"] - done["start"]
        print(f"long call {long_s:.3f} s; the short calls ended {short_s:.3f} s after it began")
        # Waiting for the long call would end them after it; the margin absorbs the GIL hand-over.
        assert short_s < 0.5 * long_s, (short_s, long_s)
    """)
    print(out)
