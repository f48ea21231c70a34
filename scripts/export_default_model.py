#!/usr/bin/env python3
"""Stores a `mhsa train` checkpoint as the embedded default model: config.json and the weights
as F16 safetensors (half the bytes; the validation loss is measured on the stored file).

    python3 scripts/export_default_model.py build/default-model models/default
"""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build" / "python"))
import mhsa  # noqa: E402


def main(src, dst):
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tensors = mhsa.load_safetensors(str(src / "model.safetensors"))
    with open(src / "config.json") as f:
        config = json.load(f)
    mhsa.save_safetensors(str(dst / "model.safetensors"), tensors, metadata={"format": "pt"}, dtype="F16")
    shutil.copy(src / "config.json", dst / "config.json")
    n = sum(v.size for v in tensors.values())
    print(f"{dst}: {n:,} parameters, {config['n_layer']} layers x {config['n_head']} heads, "
          f"width {config['n_embd']}, context {config['n_positions']}; "
          f"{(dst / 'model.safetensors').stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
