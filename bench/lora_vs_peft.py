"""A LoRA training step (loss, then the gradients of every adapter's A and B) on the default model
(SmolLM2-135M-Instruct, dequantised to float32): mhsa.Lora against PyTorch + peft on the same
token ids, rank, alpha, targets and thread count, alternated round by round; prints tokens per
second and the ratio per round. Not a test: nothing passes or fails.

    OMP_NUM_THREADS=2 PYTHONPATH=build/python python3 bench/lora_vs_peft.py [--batch 2] [--context 128]
"""

import argparse
import time
from pathlib import Path

import numpy as np
import peft
import torch
import transformers

import mhsa

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gguf = Path(mhsa.resolve_model("smollm2"))
    model = mhsa.Model.load(str(gguf))
    lora = mhsa.Lora.create(model, rank=a.rank, alpha=2 * a.rank, seed=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32)
    tuned = peft.get_peft_model(hf, peft.LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                                                    target_modules=MODULES))
    rng = np.random.default_rng(0)
    ids, targets = (rng.integers(0, model.config["vocab_size"], (a.batch, a.context)) for _ in range(2))

    def ours():
        lora.loss_and_grad(model, ids, targets)

    def theirs():
        tuned.zero_grad()
        logits = tuned(torch.tensor(ids)).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          torch.tensor(targets).reshape(-1)).backward()

    ours(), theirs()  # warm-up
    tokens = a.batch * a.context
    for r in range(a.rounds):
        t0 = time.perf_counter()
        ours()
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        theirs()
        t_theirs = time.perf_counter() - t0
        print(f"round {r}: mhsa {tokens / t_ours:.0f} tok/s, PyTorch + peft {tokens / t_theirs:.0f} tok/s, "
              f"ratio {t_theirs / t_ours:.2f}", flush=True)


if __name__ == "__main__":
    main()
