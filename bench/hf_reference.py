#!/usr/bin/env python3
"""Transformers as the reference for a GGUF model (by default SmolLM2-135M-Instruct, Q4_1 weights).

transformers reads the GGUF file and dequantises its weights to float32; this script then

  --save-dir DIR      saves that dequantised model and its tokenizer (save_pretrained: float32
                      safetensors, tokenizer.json) for tools that read Hugging Face directories
                      (lm-eval's `hf` model, `mhsa --model DIR`);
  --logits            compares transformers' float32 logits with mhsa's (mhsa.Model.load(gguf,
                      dtype="f32")) on several prompts, after checking that mhsa's GGUF tokenizer
                      gives transformers' ids: prints max|mhsa - hf| / max|hf| per prompt;
  --perplexity FILE   perplexity of FILE as llama.cpp's llama-perplexity computes it: the whole text
                      tokenized once (BOS only if the GGUF's tokenizer.ggml.add_bos_token says so),
                      n_tokens // ctx chunks of ctx tokens each run from an empty cache, the second
                      half of each chunk scored (tokens j+1 for j in [ctx/2, ctx-1)), float64 sums;
                      --float64 also runs the model in float64, --mhsa also scores mhsa's f32 logits.

transformers' GGUF tokenizer ignores tokenizer.ggml.pre; for llama.cpp's digit-splitting pre-tokenizers
("smollm", ...) the script puts SmolLM2's own Digits + ByteLevel pre-tokenizer back (ids then equal
llama.cpp's and mhsa's), also in the directory --save-dir writes.

Requires: pip install torch transformers gguf accelerate (accelerate: transformers' GGUF loading).
Results (SmolLM2-135M-Instruct Q4_1, GPL-3 + Apache-2.0, 9854 tokens, -c 512, 19 chunks): PPL hf f32
18.110658, hf f64 18.110655, mhsa f32 18.110656 (`mhsa perplexity`: 18.1107); logits max rel error
mhsa vs hf f32 2.0e-6 .. 7.4e-6 on the 9 prompts.

Example:
  python3 bench/hf_reference.py --save-dir /tmp/smollm2-135m-instruct-f32
  PYTHONPATH=build/python HF_HUB_OFFLINE=1 python3 bench/hf_reference.py --logits --float64 --mhsa \\
      --perplexity <(cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0) -c 512
"""
import argparse
import copy
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch

DEFAULT_GGUF = "/work/main/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter who",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 17 times 23?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis converts light energy into chemical energy. In plants, this process takes place in the",
    "1, 2, 3, 5, 8, 13, 21, 34,",
    "Der schnelle braune Fuchs springt über den faulen Hund. La vie est belle! 東京は日本の首都です。",
    "TERMS AND CONDITIONS\n\n  0. Definitions.\n\n  1. Version 2.0, January 2004; 3.14159 and 1000000",
    "   Whitespace\t\tand\nnewlines\n\n\n  and émojis 🙂🚀 and URLs https://example.com/a?b=c&d=e",
]


def gguf_metadata(path):
    """The GGUF's tokenizer.ggml.add_bos_token (None when absent) and its token ids of BOS/EOS."""
    import gguf
    r = gguf.GGUFReader(path)

    def scalar(key):
        f = r.fields.get(key)
        if f is None:
            return None
        return f.parts[f.data[0]].tolist()[0]

    def string(key):
        f = r.fields.get(key)
        return None if f is None else bytes(f.parts[f.data[0]]).decode()

    return {"add_bos_token": scalar("tokenizer.ggml.add_bos_token"),
            "pre": string("tokenizer.ggml.pre"),
            "bos_token_id": scalar("tokenizer.ggml.bos_token_id"),
            "eos_token_id": scalar("tokenizer.ggml.eos_token_id")}


# llama.cpp's pre-tokenizers (tokenizer.ggml.pre) that split every digit off before GPT-2's regex,
# as SmolLM2's own tokenizer.json does (Digits(individual_digits) then ByteLevel).
DIGIT_SPLIT_PRE = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}


def load_hf(gguf_path, meta, dtype=torch.float32):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, name = os.path.split(os.path.abspath(gguf_path))
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    if meta["pre"] in DIGIT_SPLIT_PRE:
        # transformers' GGUF conversion ignores tokenizer.ggml.pre and pre-tokenizes with GPT-2's
        # regex alone, so "  0." becomes [" ", " ", "0", "."] where llama.cpp and the model's own
        # tokenizer.json give ["  ", "0", "."] (9882 tokens instead of 9854 on GPL-3 + Apache-2.0).
        from tokenizers import pre_tokenizers as pt
        tok.backend_tokenizer.pre_tokenizer = pt.Sequence([
            pt.Digits(individual_digits=True),
            pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
        print(f"transformers' tokenizer: digits split off first, as tokenizer.ggml.pre = {meta['pre']!r} says")
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=dtype)
    model.eval()
    print(f"transformers: loaded {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{dtype}) in {time.time() - t0:.1f} s", flush=True)
    return tok, model


def hf_ids(tok, text, add_bos):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if add_bos and tok.bos_token_id is not None:
        ids = [tok.bos_token_id] + ids
    return ids


@torch.inference_mode()
def hf_logits(model, ids):
    return model(torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0]


def plain_model(model, dtype=torch.float32):
    """The model's weights in a plain (not quantised) model of dtype.

    transformers marks a model read from GGUF as quantised (hf_quantizer, config.quantization_config):
    it refuses save_pretrained and .float(), and .double() leaves it float32. Its weights are already
    dequantised float32: copy them into a model made from the config."""
    from transformers import AutoModelForCausalLM
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"weights missing {missing}, unexpected {unexpected}")
    plain.generation_config = model.generation_config
    plain.to(dtype).eval()
    assert all(p.dtype == dtype for p in plain.parameters())
    return plain


def cmd_save(args, tok, model):
    os.makedirs(args.save_dir, exist_ok=True)
    plain_model(model).save_pretrained(args.save_dir, safe_serialization=True)
    tok.save_pretrained(args.save_dir)
    print(f"saved the float32 model and tokenizer to {args.save_dir}: {sorted(os.listdir(args.save_dir))}")


def cmd_logits(args, tok, model, meta):
    import mhsa
    m = mhsa.Model.load(args.gguf, dtype="f32")
    mt = mhsa.Tokenizer.load(args.gguf)
    print(f"mhsa: family {m.family}, dtype {m.dtype}")
    model64 = plain_model(model, torch.float64) if args.float64 else None
    worst = 0.0
    bad_ids = 0
    for i, text in enumerate(PROMPTS):
        ids = hf_ids(tok, text, bool(meta["add_bos_token"]))
        ids_default = tok(text)["input_ids"]
        mids = list(mt.encode(text))
        same = mids == ids_default
        if not same:
            bad_ids += 1
            print(f"prompt {i}: TOKENIZER MISMATCH: hf {ids_default}\n            mhsa {mids}")
        a = np.asarray(m.forward(np.asarray(ids, dtype=np.int32)), dtype=np.float64)
        b = hf_logits(model, ids).double().numpy()
        assert a.shape == b.shape, (a.shape, b.shape)
        rel = np.abs(a - b).max() / np.abs(b).max()
        argmax_agree = (a.argmax(-1) == b.argmax(-1)).mean()
        worst = max(worst, rel)
        f64 = ""
        if model64 is not None:  # both float32 results against float64
            c = hf_logits(model64, ids).numpy()
            f64 = (f", vs float64: mhsa {np.abs(a - c).max() / np.abs(c).max():.3e}, "
                   f"hf f32 {np.abs(b - c).max() / np.abs(c).max():.3e}")
        print(f"prompt {i}: {len(ids):3d} tokens, ids {'equal' if same else 'DIFFER'}, "
              f"max rel error {rel:.3e}, argmax agreement {argmax_agree:.3f}{f64}  {text[:32]!r}", flush=True)
    print(f"logits: worst max rel error {worst:.3e} over {len(PROMPTS)} prompts; tokenizer mismatches: {bad_ids}")
    return worst, bad_ids


def perplexity(name, logits_fn, tokens, ctx):
    n_chunks = len(tokens) // ctx
    first = ctx // 2
    nll, count = 0.0, 0
    t0 = time.time()
    line = []
    for i in range(n_chunks):
        chunk = tokens[i * ctx:(i + 1) * ctx]
        logits = np.asarray(logits_fn(chunk), dtype=np.float64)  # [ctx, V]
        x = logits[first:ctx - 1]
        mx = x.max(-1, keepdims=True)
        lse = (mx[:, 0] + np.log(np.exp(x - mx).sum(-1)))
        tgt = np.asarray(chunk[first + 1:ctx])
        nll += float((lse - x[np.arange(len(tgt)), tgt]).sum())
        count += len(tgt)
        line.append(f"[{i + 1}]{math.exp(nll / count):.4f}")
        if (i + 1) % 8 == 0 or i + 1 == n_chunks:
            print(f"{name}: " + ",".join(line), flush=True)
            line = []
    ppl = math.exp(nll / count)
    print(f"{name}: Final estimate: PPL = {ppl:.6f} ({n_chunks} chunks of {ctx}, {count} tokens scored, "
          f"{time.time() - t0:.0f} s)", flush=True)
    return ppl


def cmd_perplexity(args, tok, model, meta):
    with open(args.perplexity, encoding="utf-8") as f:
        text = f.read()
    add_bos = bool(meta["add_bos_token"])
    tokens = hf_ids(tok, text, add_bos)
    print(f"perplexity: {len(text)} characters, {len(tokens)} tokens (BOS {'added' if add_bos else 'not added'}: "
          f"tokenizer.ggml.add_bos_token = {meta['add_bos_token']}), ctx {args.ctx}, "
          f"{len(tokens) // args.ctx} chunks", flush=True)
    results = {}
    results["hf f32"] = perplexity("hf f32", lambda c: hf_logits(model, c).numpy(), tokens, args.ctx)
    if args.mhsa:
        import mhsa
        mt = mhsa.Tokenizer.load(args.gguf)
        mtoks = list(mt.encode(text, add_special_tokens=add_bos))
        print(f"mhsa tokenizer: {'same ids' if mtoks == tokens else 'DIFFERENT ids'} on the whole text "
              f"({len(mtoks)} tokens)", flush=True)
        m = mhsa.Model.load(args.gguf, dtype="f32")
        results["mhsa f32"] = perplexity("mhsa f32", lambda c: m.forward(np.asarray(c, dtype=np.int32)),
                                         tokens, args.ctx)
    if args.float64:
        model64 = plain_model(model, torch.float64)
        results["hf f64"] = perplexity("hf f64", lambda c: hf_logits(model64, c).numpy(), tokens, args.ctx)
        del model64
    print("perplexity: " + ", ".join(f"{k} {v:.6f}" for k, v in results.items()))
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", default=DEFAULT_GGUF)
    p.add_argument("--save-dir")
    p.add_argument("--logits", action="store_true")
    p.add_argument("--perplexity", metavar="FILE")
    p.add_argument("-c", "--ctx", type=int, default=512)
    p.add_argument("--float64", action="store_true", help="also run the model in float64 (perplexity; --logits: both float32 results against it)")
    p.add_argument("--mhsa", action="store_true", help="perplexity also from mhsa's f32 logits")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if not (args.save_dir or args.logits or args.perplexity):
        p.error("nothing to do: give --save-dir, --logits and/or --perplexity")
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = gguf_metadata(args.gguf)
    print(f"gguf: {args.gguf}: {meta}")
    tok, model = load_hf(args.gguf, meta)
    if args.save_dir:
        cmd_save(args, tok, model)
    if args.logits:
        cmd_logits(args, tok, model, meta)
    if args.perplexity:
        cmd_perplexity(args, tok, model, meta)


if __name__ == "__main__":
    sys.exit(main())
