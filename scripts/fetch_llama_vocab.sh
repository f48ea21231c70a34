#!/usr/bin/env bash
# Puts llama.cpp's own tokenizer test files (models/ggml-vocab-NAME.gguf with .inp and .out: test
# strings and the ids llama.cpp's test-tokenizer-0 expects) where tests/python/test_gguf_tokenizers.py
# finds them: ~/.cache/mhsa/llama-vocab (or $MHSA_LLAMA_VOCAB). They come from the llama-cpp-python
# 0.3.36 source distribution on PyPI (pip download; its SHA-256 checked), kept in
# ~/.cache/mhsa/sdist so that it is downloaded once; only the vocabularies the test uses (~60 MB) are
# extracted. Does nothing when they are all there. scripts/setup.sh --test runs it.
set -euo pipefail
python=${PYTHON:-python3}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mhsa
dest=${MHSA_LLAMA_VOCAB:-$cache/llama-vocab}
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
sdist=$cache/sdist/llama_cpp_python-$version.tar.gz
names=(llama-spm phi-3 llama-bpe qwen2 qwen35 gpt-2 starcoder refact falcon deepseek-coder mpt deepseek-llm command-r gemma-4)

missing=0
for n in "${names[@]}"; do
  for ext in "" .inp .out; do [ -f "$dest/ggml-vocab-$n.gguf$ext" ] || missing=1; done
done
if [ "$missing" -eq 0 ]; then
  echo "fetch_llama_vocab.sh: llama.cpp's vocab files are in $dest"
  exit 0
fi

if [ ! -f "$sdist" ] || ! echo "$sha256  $sdist" | sha256sum --check --status; then
  echo "fetch_llama_vocab.sh: pip download llama-cpp-python==$version (the source distribution, ~77 MB) into $cache/sdist"
  mkdir -p "$cache/sdist"
  rm -f "$sdist"
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    --dest "$cache/sdist" "llama-cpp-python==$version"
fi
echo "$sha256  $sdist" | sha256sum --check --status || {
  echo "fetch_llama_vocab.sh: $sdist: SHA-256 is not $sha256" >&2
  exit 1
}

members=()
for n in "${names[@]}"; do
  for ext in "" .inp .out; do members+=("llama_cpp_python-$version/vendor/llama.cpp/models/ggml-vocab-$n.gguf$ext"); done
done
mkdir -p "$dest"
tmp=$(mktemp -d "$dest/.extract.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp" "${members[@]}"
mv -f "$tmp/llama_cpp_python-$version/vendor/llama.cpp/models/"ggml-vocab-* "$dest/"
echo "fetch_llama_vocab.sh: ${#names[@]} vocabularies of llama.cpp in $dest"
