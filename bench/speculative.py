#!/usr/bin/env python3
"""Speculative decoding on the default model (SmolLM2-135M-Instruct): single-stream decode speed with
and without prompt lookup, and against llama.cpp's own prompt lookup (llama-lookup) on the same
weights, in paired rounds.

Prompts (stated here, built from Debian's licence texts so that anyone can rerun them):
  input-grounded: quote a section, summarise reusing the wording, fix spelling in a text, replace a
  word throughout, turn sentences into a numbered list;
  open-ended: a story, an explanation, a description.
Each is rendered through the model's chat template. mhsa runs in this process (Model.generate with
return_stats: decode tokens / decode seconds; greedy, stops at the end of turn or --tokens);
llama-lookup runs the same rendered text on a Q8_0 GGUF of the same weights (the copy
bench/llama_cpp_peer.sh makes, MHSA_PEER_ARCH=smollm2) with -t threads and --spec-draft-n-max, its own
"decoded N tokens in S seconds". A round runs every engine on a prompt back to back; the table gives
the medians over rounds and the ratios within each round (median).

  python3 bench/speculative.py [--rounds 3] [--tokens 256] [--draft 6] [--threads 2] [--dtype q8_0]
      [--peer-dir build/peer] [--json out.jsonl]
  python3 bench/speculative.py --row-costs [--dtype q8_0]   # a forward of n = 1..8 rows over a
      400-token cache against one row (the best of 40 tries each, interleaved): what a guess costs

Without llama-lookup (build it: cmake --build build/peer/build-llama-* --target llama-lookup) the
peer column is left out. Progress goes to stderr.
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LICENCES = Path("/usr/share/common-licenses")


def section(text, start, end):
    i = text.index(start)
    return text[i:text.index(end, i)].strip()


def prompts():
    apache = (LICENCES / "Apache-2.0").read_text()
    bsd = (LICENCES / "BSD").read_text()
    gpl = (LICENCES / "GPL-3").read_text()
    grant = section(apache, "1. Definitions.", "4. Redistribution.")
    preamble = section(gpl, "The GNU General Public License is a free", "The precise terms and conditions")
    typos = (bsd.replace("Redistribution", "Redistributon").replace("permitted", "permited")
             .replace("following", "folowing").replace("conditions", "condtions").replace("software", "sofware"))
    short = section(apache, "2. Grant of Copyright License.", "3. Grant of Patent License.")
    grounded = {
        "quote": "Quote the section '2. Grant of Copyright License.' from the text below, word for word.\n\n" + grant,
        "summarise": "Summarise the following text in five bullet points, reusing its own wording.\n\n" + preamble,
        "spelling": "Fix the spelling mistakes in the following text and return the whole corrected text.\n\n" + typos,
        "replace": ("Rewrite the following text, replacing the word 'software' with 'program' everywhere. "
                    "Return the full text.\n\n" + preamble[:1500]),
        "list": "Turn the following text into a numbered list, one sentence per item, each sentence unchanged.\n\n" + short,
    }
    open_ended = {
        "story": "Write a short story about a robot who learns to paint.",
        "exercise": "What are three benefits of regular exercise? Explain each one.",
        "rainbow": "Describe how a rainbow forms.",
    }
    return grounded, open_ended


def llama_lookup(binary, gguf, text, tokens, draft, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([binary, "-m", gguf, "-f", path, "-n", str(tokens), "--spec-draft-n-max", str(draft), "-t",
                            str(threads), "--temp", "0", "-c", "4096"],
                           capture_output=True, text=True, errors="replace", timeout=900)
    finally:
        os.unlink(path)
    out = r.stdout + r.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"llama-lookup failed ({r.returncode}): {out[-2000:]}")
    acc = re.search(r"accept\s+=\s+([\d.]+)%", out)
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)),
            "tokens_per_s": int(m.group(1)) / float(m.group(2)), "accept": float(acc.group(1)) if acc else None}


def row_costs(model):
    import numpy as np
    ids = np.arange(1, 400, dtype=np.int64)
    cache = model.new_cache(1, 400 + 40 * 36)
    model.extend(cache, ids.reshape(1, -1), last_only=True)
    best = {n: float("inf") for n in range(1, 9)}
    for _ in range(40):
        for n in best:
            t = time.perf_counter()
            model.extend(cache, ids[:n].reshape(1, -1), last_only=False)
            best[n] = min(best[n], time.perf_counter() - t)
    print("| rows | ms | against one row |")
    print("|---:|---:|---:|")
    for n, t in best.items():
        print(f"| {n} | {t * 1e3:.2f} | {t / best[1]:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--draft", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("--peer-dir", default=str(ROOT / "build" / "peer"))
    ap.add_argument("--json", help="append one JSON line per prompt and round")
    ap.add_argument("--row-costs", action="store_true", help="only the cost of a forward's further rows")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    sys.path.insert(0, str(ROOT / "build" / "python"))
    import mhsa

    model = mhsa.Model.load("smollm2", dtype=a.dtype)
    if a.row_costs:
        return row_costs(model)
    tok = mhsa.Tokenizer.load("smollm2")
    binaries = sorted(glob.glob(os.path.join(a.peer_dir, "build-llama-*", "bin", "llama-lookup")))
    gguf = os.path.join(a.peer_dir, "smollm2", "SmolLM2-135M-Instruct.Q8_0.gguf")
    peer = binaries[-1] if binaries and os.path.exists(gguf) else None
    if not peer:
        print("speculative.py: no llama-lookup or Q8_0 GGUF under --peer-dir: peer left out", file=sys.stderr)
    grounded, open_ended = prompts()
    rows = []
    for kind, group in (("input-grounded", grounded), ("open-ended", open_ended)):
        for name, text in group.items():
            messages = [{"role": "user", "content": text}]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            runs = []
            for r in range(a.rounds):
                res = {}
                for draft in (0, a.draft):
                    out, st = model.generate(ids, a.tokens, draft_tokens=draft, return_stats=True)
                    res[f"mhsa_d{draft}"] = {
                        "tokens": int(st["decode_tokens"]) + 1,
                        "tokens_per_s": st["decode_tokens"] / st["decode_seconds"] if st["decode_seconds"] else 0.0,
                        "accepted": st["accepted"], "drafted": st["drafted"], "forwards": st["forwards"],
                        "out": out[len(ids):].tolist()}
                assert res[f"mhsa_d{a.draft}"]["out"] == res["mhsa_d0"]["out"], "greedy tokens differ"
                if peer:
                    res["llama_lookup"] = llama_lookup(peer, gguf, rendered, a.tokens, a.draft, a.threads)
                line = {"prompt": name, "kind": kind, "round": r, "prompt_tokens": len(ids), "draft": a.draft,
                        **{k: {kk: vv for kk, vv in v.items() if kk != "out"} for k, v in res.items()},
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(line) + "\n")
                runs.append(res)
                spec = res[f"mhsa_d{a.draft}"]
                print(f"{name} round {r}: plain {res['mhsa_d0']['tokens_per_s']:.1f} t/s, lookup "
                      f"{spec['tokens_per_s']:.1f} t/s ({spec['accepted']}/{spec['drafted']} kept)"
                      + (f", llama-lookup {res['llama_lookup']['tokens_per_s']:.1f} t/s" if peer else ""),
                      file=sys.stderr)
            med = lambda key: statistics.median(x[key]["tokens_per_s"] for x in runs)  # noqa: E731
            ratio = lambda k1, k2: statistics.median(x[k1]["tokens_per_s"] / x[k2]["tokens_per_s"] for x in runs)  # noqa: E731
            spec = f"mhsa_d{a.draft}"
            drafted = sum(x[spec]["drafted"] for x in runs)
            rows.append([kind, name, len(ids), runs[0]["mhsa_d0"]["tokens"], f"{med('mhsa_d0'):.1f}", f"{med(spec):.1f}",
                         f"{100 * sum(x[spec]['accepted'] for x in runs) / drafted:.0f}%" if drafted else "-",
                         f"{ratio(spec, 'mhsa_d0'):.2f}x",
                         f"{med('llama_lookup'):.1f}" if peer else "-",
                         f"{ratio(spec, 'llama_lookup'):.2f}x" if peer else "-"])
    print(f"| kind | prompt | prompt tokens | tokens made | mhsa plain t/s | mhsa lookup t/s | guesses kept | "
          f"lookup / plain | llama-lookup t/s | mhsa lookup / llama-lookup |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
    main()
