#!/usr/bin/env python3
"""Encoding speed of mhsa.Tokenizer against Hugging Face tokenizers and tiktoken, in one run.

    PYTHONPATH=build/python python3 bench/tokenizer_speed.py [--text FILE ...] [--unit file|paragraph] [--repeats 3]
                                                            [--only ENGINE ...] [--tokenizers NAME ...]

English text (by default vim's documentation, /usr/share/vim/vim*/doc/*.txt, 9.5 MB as read).
The same documents go to every engine, one encode call each: a file each by default, or with
--unit paragraph the files cut after each blank line (no byte lost, so the totals match); never
one 9.5 MB string, which would be one BPE word for the SentencePiece-style files. Every engine
runs on one thread: RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false for tokenizers (set
before it is imported), and mhsa and tiktoken encode on the calling thread. Each engine starts
from a freshly loaded tokenizer every repeat (no cache starts warm) and the repeats alternate
between engines. Printed: the median over the repeats of 10^6 bytes of UTF-8 per CPU second of
the process (a busy machine's waits for a core do not count) and per wall-clock second.
tokenizers is timed twice: encode() per document (which also computes offsets), and
encode_batch_fast() over all the documents at once (no offsets, its fastest path).
Tokenizers:
  gpt2           GPT-2's real files: mhsa from vocab.json+merges.txt (its own path), mhsa from
                 the tokenizer.json that tokenizers writes for them, tokenizers, tiktoken;
  llama3-style   a byte-level BPE trained here with Llama 3's Split regex and ignore_merges
                 (mhsa, tokenizers, and tiktoken with the same regex and ranks);
  qwen2-style    NFC + Qwen2's Split regex, byte-level (mhsa, tokenizers);
  llama2-style   SentencePiece-style BPE (Prepend/Replace normalizers, byte fallback, no
                 pre-tokenizer) (mhsa, tokenizers; tiktoken has no such model);
  gemma-style    Replace normalizer, a String Split, byte fallback (mhsa, tokenizers).
The trained files are tests/python/test_tokenizer_json.py's. --only keeps the engines whose name
starts with one of its words (--only mhsa: mhsa's rows alone), --tokenizers the named ones
(--tokenizers llama3-style qwen2-style). Nothing here passes or fails: it prints a table.
"""

import argparse
import glob
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

import tiktoken  # noqa: E402
from tiktoken.load import data_gym_to_mergeable_bpe_ranks  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import mhsa  # noqa: E402
import test_tokenizer_json as fams  # noqa: E402


def timed(fn, texts, batch):
    """(CPU seconds of this process, wall seconds): on a shared machine, time spent waiting for a
    core is not counted in the first."""
    cpu, wall = time.process_time(), time.perf_counter()
    if batch:
        fn(texts)
    else:
        for t in texts:
            fn(t)
    return time.process_time() - cpu, time.perf_counter() - wall


def paragraphs(text):
    """The text cut after each blank line; the pieces join back to the text."""
    parts = re.split(r"(?<=\n\n)", text)
    return [p for p in parts if p]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", nargs="*", default=sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt")))
    ap.add_argument("--unit", choices=["file", "paragraph"], default="file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="engines whose name starts with one of these (default: all)")
    ap.add_argument("--tokenizers", nargs="*", help="these tokenizers (default: all)")
    args = ap.parse_args()
    texts = [pathlib.Path(p).read_text(encoding="utf-8", errors="replace") for p in args.text]
    if args.unit == "paragraph":
        texts = [p for t in texts for p in paragraphs(t)]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"{len(texts)} documents ({args.unit}s), {nbytes / 1e6:.2f} MB, one thread, median of {args.repeats}")

    tmp = pathlib.Path(tempfile.mkdtemp())
    gpt2_dir = ROOT / "tests" / "data" / "gpt2-tokenizer"
    from tokenizers import ByteLevelBPETokenizer
    hf_gpt2 = ByteLevelBPETokenizer(str(gpt2_dir / "encoder.json"), str(gpt2_dir / "vocab.bpe"))
    hf_gpt2.add_special_tokens(["<|endoftext|>"])
    (tmp / "gpt2").mkdir()
    hf_gpt2.save(str(tmp / "gpt2" / "tokenizer.json"))
    ranks = data_gym_to_mergeable_bpe_ranks(str(gpt2_dir / "vocab.bpe"), str(gpt2_dir / "encoder.json"))
    built = fams.build_families()
    cases = {}
    hf_file = lambda d: Tokenizer.from_file(str(d / "tokenizer.json"))  # noqa: E731
    # Each entry: name → (make an encoder, whether it takes the whole list of documents).
    cases["gpt2"] = {
        "mhsa (vocab.json)": (lambda: mhsa.Tokenizer.load(gpt2_dir).encode, False),
        "mhsa (tokenizer.json)": (lambda: mhsa.Tokenizer.load(tmp / "gpt2").encode, False),
        "tokenizers encode": (lambda: hf_file(tmp / "gpt2").encode, False),
        "tokenizers batch_fast": (lambda: hf_file(tmp / "gpt2").encode_batch_fast, True),
        "tiktoken": (lambda: tiktoken.Encoding("gpt2", pat_str=fams.GPT2_PATTERN, mergeable_ranks=ranks,
                                               special_tokens={}).encode_ordinary, False),
    }
    for name in ("llama3", "qwen2", "llama2", "gemma"):
        d = tmp / name
        d.mkdir()
        built[name].save(str(d / "tokenizer.json"))
        cases[f"{name}-style"] = {
            "mhsa": (lambda d=d: mhsa.Tokenizer.load(d).encode, False),
            "tokenizers encode": (lambda d=d: hf_file(d).encode, False),
            "tokenizers batch_fast": (lambda d=d: hf_file(d).encode_batch_fast, True),
        }
    vocab = built["llama3"].get_vocab()
    byte_of = {c: b for b, c in enumerate(_bytes_to_unicode())}
    l3_ranks = {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items() if all(c in byte_of for c in tok)
                and not tok.startswith("<|")}
    cases["llama3-style"]["tiktoken"] = (lambda: tiktoken.Encoding("l3", pat_str=fams.LLAMA3_PATTERN,
                                                                   mergeable_ranks=l3_ranks,
                                                                   special_tokens={}).encode_ordinary, False)
    print(f"{'tokenizer':14s} {'engine':24s} {'MB/CPU s':>9s} {'MB/s wall':>9s}")
    for case, runners in cases.items():
        if args.tokenizers and case not in args.tokenizers:
            continue
        if args.only:
            runners = {k: v for k, v in runners.items() if any(k.startswith(o) for o in args.only)}
        times = {k: [] for k in runners}
        for _ in range(args.repeats):
            for k, (make, batch) in runners.items():
                times[k].append(timed(make(), texts, batch))
        for k, ts in times.items():
            cpu = statistics.median(t[0] for t in ts)
            wall = statistics.median(t[1] for t in ts)
            print(f"{case:14s} {k:24s} {nbytes / cpu / 1e6:9.1f} {nbytes / wall / 1e6:9.1f}")


def _bytes_to_unicode():
    """GPT-2's byte → character table, as characters in byte order."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


if __name__ == "__main__":
    main()
