#!/usr/bin/env python3
"""Writes a Hugging Face model directory (config.json, model.safetensors, tokenizer files) with
random weights in the shape of a known model, written by transformers' save_pretrained: the one
directory both mhsa and llama.cpp's convert_hf_to_gguf.py read for a speed comparison
(bench/llama_cpp_peer.sh, bench/compare_llama_cpp.py). Not a model: the weights are noise.

  random_hf_model.py --arch gpt2|smollm2 OUT [--seed 0]

- gpt2: GPT-2 124M (GPT2LMHeadModel(GPT2Config())), with the GPT-2 tokenizer from
  tests/data/gpt2-tokenizer;
- smollm2: SmolLM2-135M's shape (LlamaForCausalLM: 30 layers, C 576, 9 query heads and 3 key/value
  heads of 64, MLP 1536, vocabulary 49152, tied embeddings, rope_theta 100000). SmolLM2's own
  tokenizer cannot be fetched here, so the directory gets a stand-in of the same vocabulary size
  that the converter accepts (a Llama-style BPE tokenizer.json with byte fallback: the 3 special
  tokens, the 256 byte tokens, and filler pieces). Tokenization does not enter pp/tg timings.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, hidden_act="silu",
                    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                    attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2)


def write_gpt2(out):
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    # transformers >= 5 no longer writes GPT-2's legacy "n_ctx" key, which the converter's GPT-2
    # path still reads; it equals n_positions (1024).
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("n_ctx", cfg["n_positions"])
    cfg_path.write_text(json.dumps(cfg, indent=2))
    tok = ROOT / "tests" / "data" / "gpt2-tokenizer"
    shutil.copyfile(tok / "encoder.json", out / "vocab.json")
    shutil.copyfile(tok / "vocab.bpe", out / "merges.txt")
    return model


def llama_style_tokenizer(vocab_size):
    """A BPE tokenizer with byte fallback in the layout of Llama 2's tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(vocab) < vocab_size:  # filler pieces, "▁a", "▁b", ..., "▁aa", ...
        i, piece = len(vocab) - 259, ""
        while True:
            piece = letters[i % 26] + piece
            i = i // 26 - 1
            if i < 0:
                break
        vocab["▁" + piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def write_smollm2(out):
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    llama_style_tokenizer(SMOLLM2_135M["vocab_size"]).save_pretrained(out)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=("gpt2", "smollm2"), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    model = write_gpt2(args.out) if args.arch == "gpt2" else write_smollm2(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.arch} random model: {n / 1e6:.1f}M parameters in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
