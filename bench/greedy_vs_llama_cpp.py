#!/usr/bin/env python3
"""Greedy tokens of mhsa and llama.cpp on the same GGUF file, the file made by llama.cpp's own
convert_hf_to_gguf.py from a Hugging Face directory.

Plain random weights give near-flat distributions, where the roundings of two correct engines
flip greedy choices between near ties; so the models here (a small Llama: grouped heads, RoPE,
SwiGLU; a small GPT-2; both with GPT-2's tokenizer, written by transformers' save_pretrained) have
their token embedding, the tied LM head, scaled by 20: logits spread over tens of units and greedy
choices are decided by wide gaps. (A briefly trained model would do as well; training a 50257-token
head takes minutes this script does not spend.)
For each model, each GGUF type (F32, and F16 and Q8_0 via --outtype f16 / q8_0) and each prompt, mhsa
(`mhsa generate --json --temperature 0 --ignore-eos`: its prompt ids and tokens) and llama.cpp
(its library, libllama, driven by bench/llama_greedy.cpp on the same prompt ids: the argmax of
llama_get_logits at each step, as its greedy sampler picks) generate N tokens; the table counts
equal tokens up to the first difference. At a difference the script
reports why: the gap between mhsa's two candidate logits there (mhsa's Python module, on the same
file). A third model is the Llama with Llama 3's RoPE scaling added to its config.json (factor 32,
original context 64, so that every frequency band is used in a short text): the converter writes
it as a rope_freqs tensor, which both engines must apply.

  greedy_vs_llama_cpp.py [--tokens 64] [--threads 2] [--kv-f16]

Builds libllama on the first run (bench/llama_cpp_peer.sh, MHSA_PEER_TARGETS=llama; several
minutes on 2 cores) and the driver against it; the models are written once into build/greedy/.
llama.cpp keeps its KV cache in F32 here (as mhsa does); --kv-f16 gives it its default F16 cache. Needs build/mhsa and build/python (mhsa's Python module). Not a test: llama.cpp
is not in CI (tests/python/test_gguf.py checks the converter's layout with the gguf package).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "greedy"
PROMPTS = [
    "The attention kernel",
    "mhsa serve runs",
    "Every fast kernel has",
    "The tokenizer reads",
]


def log(*a):
    print("[greedy]", *a, file=sys.stderr, flush=True)


def make_model(arch, seed=0):
    """A small model of `arch` with GPT-2's tokenizer, random weights with the token embedding (the
    tied LM head) scaled by 20: logits spread over tens of units, so the greedy choice is decided by
    gaps far above either engine's rounding (plain random weights leave near ties everywhere)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    hf = WORK / f"{arch}-hf"
    if (hf / "model.safetensors").exists():
        return hf
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = transformers.LlamaConfig(vocab_size=50257, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                       rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=50256,
                                       eos_token_id=50256)
        model = transformers.LlamaForCausalLM(cfg)
        embedding = model.model.embed_tokens.weight
    else:
        cfg = transformers.GPT2Config(vocab_size=50257, n_embd=128, n_layer=2, n_head=4, n_positions=256)
        model = transformers.GPT2LMHeadModel(cfg)
        embedding = model.transformer.wte.weight
    with torch.no_grad():
        embedding.mul_(20.0)
    tmp = WORK / f"{arch}-hf.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp, safe_serialization=True)
    cfg_json = json.loads((tmp / "config.json").read_text())
    if arch == "gpt2":
        cfg_json.setdefault("n_ctx", cfg_json["n_positions"])  # the converter's GPT-2 path reads the legacy key
    (tmp / "config.json").write_text(json.dumps(cfg_json, indent=2))
    src = ROOT / "tests" / "data" / "gpt2-tokenizer"
    shutil.copyfile(src / "encoder.json", tmp / "vocab.json")
    shutil.copyfile(src / "vocab.bpe", tmp / "merges.txt")
    # The directory's tokenizer is GPT-2's (for a Llama the converter's AutoTokenizer would guess another).
    (tmp / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    tmp.rename(hf)
    return hf


def with_llama3_rope(src):
    """The Llama with Llama 3's rope_scaling added (a different model: the same for both engines)."""
    dst = WORK / "llama3rope-hf"
    if not (dst / "model.safetensors").exists():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        theta = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
        rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        cfg["rope_scaling"] = rope  # both keys: transformers 5 writes rope_parameters, which the converter prefers
        cfg["rope_parameters"] = {**rope, "rope_theta": theta}
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def peer(hf_dir, outtype):
    """llama.cpp's library built and the GGUF its converter made of hf_dir (bench/llama_cpp_peer.sh)."""
    env = dict(os.environ, MHSA_PEER_TARGETS="llama", MHSA_PEER_NO_BENCH="1", MHSA_PEER_HF_DIR=str(hf_dir),
               MHSA_PEER_OUTTYPE=outtype)
    out = subprocess.run(["bash", str(ROOT / "bench" / "llama_cpp_peer.sh")], check=True, env=env,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_greedy(peer_info):
    """bench/llama_greedy.cpp compiled against the peer's headers and static libraries (once)."""
    exe = WORK / "llama_greedy"
    src = ROOT / "bench" / "llama_greedy.cpp"
    if exe.exists() and exe.stat().st_mtime > src.stat().st_mtime:
        return exe
    s, b = Path(peer_info["src_dir"]), Path(peer_info["build_dir"])
    libs = [b / "src" / "libllama.a", *(b / "ggml" / "src" / f"libggml{x}.a" for x in ("", "-cpu", "-base"))]
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{s / 'include'}", f"-I{s / 'ggml' / 'include'}", str(src),
                    "-o", str(exe), "-Wl,--start-group", *map(str, libs), "-Wl,--end-group", "-fopenmp", "-lpthread",
                    "-ldl", "-lm"], check=True)
    return exe


def peer_generate(exe, gguf, prompts, n, threads, kv_f16):
    """llama.cpp's greedy ids after each prompt (a list of ids), from one run of the driver."""
    r = subprocess.run([str(exe), str(gguf), str(n), str(threads), "f16" if kv_f16 else "f32"],
                       input="".join(" ".join(map(str, p)) + "\n" for p in prompts), capture_output=True, text=True,
                       check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def mhsa_generate(cli, gguf, prompt, n, threads, dtype):
    r = subprocess.run([str(cli), "generate", "--model", str(gguf), "--prompt", prompt, "-n", str(n), "--json",
                        "--temperature", "0", "--ignore-eos", "--dtype", dtype, "-t", str(threads)],
                       capture_output=True, text=True, check=True)
    j = json.loads(r.stdout)
    return j["prompt_ids"], j["tokens"]


def top_gap(model, ids, a, b):
    """mhsa's logits of candidates a and b after ids, and the largest |logit| there (the scale)."""
    row = model.forward(np.asarray(ids, np.int32))[-1]
    return float(row[a]), float(row[b]), float(np.abs(row).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cli", type=Path, default=ROOT / "build" / "mhsa")
    ap.add_argument("--kv-f16", action="store_true", help="llama.cpp's default F16 KV cache")
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)

    llama = make_model("llama")
    models = [("llama", llama), ("gpt2", make_model("gpt2")),
              ("llama+llama3 rope", with_llama3_rope(llama))]
    rows, notes, version = [], [], ""
    for name, hf in models:
        for outtype, dtypes in (("f32", ["f32"]), ("f16", ["f32", "f16"]), ("q8_0", ["f32", "q8_0"])):
            p = peer(hf, outtype)
            version = p["llama_cpp_version"]
            exe = llama_greedy(p)
            for dtype in dtypes:
                model = None
                equal = total = 0
                firsts = []
                runs = [mhsa_generate(a.cli, p["gguf"], prompt, a.tokens, a.threads, dtype) for prompt in PROMPTS]
                peers = peer_generate(exe, p["gguf"], [ids for ids, _ in runs], a.tokens, a.threads, a.kv_f16)
                for k, ((ids, ours), theirs) in enumerate(zip(runs, peers)):
                    same = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
                    equal += same
                    total += a.tokens
                    if same < a.tokens:
                        sys.path.insert(0, str(ROOT / "build" / "python"))
                        import mhsa  # noqa: PLC0415 — only where a difference is explained

                        model = model or mhsa.Model.load(p["gguf"], dtype=dtype)
                        la, lb, scale = top_gap(model, ids + ours[:same], ours[same], theirs[same])
                        firsts.append(f"p{k}@{same}")
                        notes.append(f"{name} {outtype.upper()} mhsa {dtype}, prompt {k} ({PROMPTS[k]!r}), token {same}: "
                                     f"mhsa {ours[same]} (logit {la:.5f}), llama.cpp {theirs[same]} (mhsa's logit "
                                     f"{lb:.5f}); gap {la - lb:.2e} of logits up to {scale:.1f}")
                rows.append((name, outtype.upper(), dtype, len(PROMPTS), total, equal, ", ".join(firsts) or "-"))
                log("row:", rows[-1])
    print(f"greedy tokens, mhsa vs {version} (libllama, bench/llama_greedy.cpp): {len(PROMPTS)} prompts x "
          f"{a.tokens} tokens, llama.cpp KV {'F16' if a.kv_f16 else 'F32'}, -t {a.threads}")
    head = ("model", "GGUF", "mhsa dtype", "prompts", "tokens", "equal (to the first difference)", "first differences")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |")
    for n in notes:
        print("difference:", n)


if __name__ == "__main__":
    main()
