#!/usr/bin/env python3
"""Encoding speed of mhsa.Tokenizer against Hugging Face tokenizers and tiktoken, in one run.

    PYTHONPATH=build/python python3 bench/tokenizer_speed.py [--text FILE ...] [--repeats 3]

English text (by default vim's documentation, /usr/share/vim/vim*/doc/*.txt, ~5 MB as read), one
string per file, encoded on one thread by each tokenizer from a freshly loaded tokenizer (so no
cache starts warm), each repeat alternating between them; the median of the repeats in MB/s
(10^6 bytes of UTF-8 per CPU second of the process, so that a busy machine's waits for a core
do not count). Tokenizers:
  gpt2           GPT-2's real files: mhsa from vocab.json+merges.txt (its own path), mhsa from
                 the tokenizer.json that tokenizers writes for them, tokenizers, tiktoken;
  llama3-style   a byte-level BPE trained here with Llama 3's Split regex and ignore_merges
                 (mhsa, tokenizers, and tiktoken with the same regex and ranks);
  llama2-style   a SentencePiece-style BPE (Prepend/Replace normalizers, byte fallback)
                 (mhsa, tokenizers; tiktoken has no such model).
Nothing here passes or fails: it prints a table.
"""

import argparse
import glob
import os
import pathlib
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


def timed(fn, texts):
    """CPU seconds of this process: on a shared machine, time spent waiting for a core is not
    counted (every tokenizer here runs on the calling thread)."""
    start = time.process_time()
    for t in texts:
        fn(t)
    return time.process_time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", nargs="*", default=sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt")))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    texts = [pathlib.Path(p).read_text(encoding="utf-8", errors="replace") for p in args.text]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"{len(texts)} texts, {nbytes / 1e6:.2f} MB, one thread, median of {args.repeats}")

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
    cases["gpt2"] = {
        "mhsa (vocab.json)": lambda: mhsa.Tokenizer.load(gpt2_dir).encode,
        "mhsa (tokenizer.json)": lambda: mhsa.Tokenizer.load(tmp / "gpt2").encode,
        "tokenizers": lambda: (lambda t, h=Tokenizer.from_file(str(tmp / "gpt2" / "tokenizer.json")): h.encode(t)),
        "tiktoken": lambda: tiktoken.Encoding("gpt2", pat_str=fams.GPT2_PATTERN, mergeable_ranks=ranks,
                                              special_tokens={}).encode_ordinary,
    }
    for name in ("llama3", "llama2"):
        d = tmp / name
        d.mkdir()
        built[name].save(str(d / "tokenizer.json"))
        cases[f"{name}-style"] = {
            "mhsa": lambda d=d: mhsa.Tokenizer.load(d).encode,
            "tokenizers": lambda d=d: (lambda t, h=Tokenizer.from_file(str(d / "tokenizer.json")): h.encode(t)),
        }
    vocab = built["llama3"].get_vocab()
    byte_of = {c: b for b, c in enumerate(_bytes_to_unicode())}
    l3_ranks = {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items() if all(c in byte_of for c in tok)
                and not tok.startswith("<|")}
    cases["llama3-style"]["tiktoken"] = lambda: tiktoken.Encoding("l3", pat_str=fams.LLAMA3_PATTERN,
                                                                  mergeable_ranks=l3_ranks, special_tokens={}).encode_ordinary
    for case, runners in cases.items():
        times = {k: [] for k in runners}
        for _ in range(args.repeats):
            for k, make in runners.items():
                times[k].append(timed(make(), texts))
        for k, ts in times.items():
            print(f"{case:14s} {k:24s} {nbytes / statistics.median(ts) / 1e6:7.1f} MB/s")


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
