"""Decode speed with and without a JSON Schema (constrained decoding), greedy, on the default model.

Runs `mhsa generate --json` alternately without and with `--json-schema`, the same prompt, no
speculation (so that only the mask differs), and prints each round's decode tokens/s and the median
ratio. The schema's answer is long (a list of 24 records) so that decode dominates; without the
schema the model writes what it writes (decode tokens/s is per token, whatever the length).
Also runs build/bench_grammar for the mask's cost per token at the vocabulary's size.

    python3 bench/grammar.py [--rounds 5] [--tokens 160] [--threads 2]
"""

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "build" / "mhsa"
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMA = {"type": "array", "minItems": 24, "maxItems": 24, "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"], "additionalProperties": False}}
PROMPT = "A JSON list of people with their name, age and city:\n"


def decode_rate(args, schema_file=None):
    cmd = [str(CLI), "generate", "--model", str(GGUF), "-t", str(args.threads), "--prompt", PROMPT,
           "-n", str(args.tokens), "--draft", "0", "--json", "--ignore-eos"]
    if schema_file:
        cmd += ["--json-schema", str(schema_file)]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return out["decode_tokens_per_s"], len(out["tokens"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=160)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        schema_file = Path(d) / "schema.json"
        schema_file.write_text(json.dumps(SCHEMA))
        ratios = []
        for r in range(args.rounds):
            plain, n0 = decode_rate(args)
            constrained, n1 = decode_rate(args, schema_file)
            ratios.append(constrained / plain)
            print(f"round {r}: plain {plain:.1f} tok/s ({n0} tokens), schema {constrained:.1f} tok/s ({n1} tokens), "
                  f"ratio {constrained / plain:.3f}")
        print(f"median ratio (schema / plain decode tokens/s): {statistics.median(ratios):.3f} over {args.rounds} rounds")
    print(subprocess.run([str(ROOT / "build" / "bench_grammar"), str(GGUF)], capture_output=True, text=True,
                         check=True).stdout, end="")


if __name__ == "__main__":
    main()
