#!/usr/bin/env bash
# Runs every test: builds, runs the C++ suite (ctest: GoogleTest, CLI, install consumer) and the
# Python suite against PyTorch (pytest), builds the Python wheel with `pip` and imports it from a
# fresh virtual environment, then rebuilds the C++ tests with AddressSanitizer +
# UndefinedBehaviorSanitizer into build-asan/ and runs them again. Before that it builds the
# libFuzzer targets (tests/fuzz/CMakeLists.txt, into build-fuzz/) and fuzzes the safetensors reader
# for 30 seconds, the tokenizer for 20, config.json, chat templates, the tokenizer's files and
# tokenizer.json files, GGUF files and the prompt cache's block files for 15 each, cross-builds the library for 64-bit ARM (portable kernels
# only) and runs tests/arm/check.cpp under qemu-aarch64.
# Run scripts/setup.sh --test first.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
jobs=$(nproc)
start=$(date +%s)
# Prints a step's name with the time since the start, so a long silent step is never a mystery.
step() { local t=$(( $(date +%s) - start )); printf '\n== [%d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*"; }

# With ccache (setup.sh --test installs it), `pip wheel .` below reuses the Release build's objects:
# the same compiler (g++) and flags, from a build directory at the same depth. Depend mode: a miss
# costs no extra preprocessor run. Only these two builds use it.
with_ccache=()
if command -v ccache >/dev/null; then
  with_ccache=(CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_DIR="$PWD/build/ccache" CCACHE_BASEDIR="$PWD"
               CCACHE_DEPEND=true CXX=g++)
fi

step "build (Release, into build/; a fresh build takes ~5 min on 2 cores)"
env "${with_ccache[@]}" scripts/build.sh

step "C++ tests"
ctest --test-dir build -j"$jobs" --output-on-failure

step "Python tests against PyTorch, transformers, tokenizers, tiktoken and Chromium (~2 min on 2 cores)"
PYTHONPATH="$PWD/build/python" OMP_NUM_THREADS="$jobs" MHSA_REQUIRE_BROWSER=1 "$python" -m pytest -q tests/python

step "pip wheel . (the Release build's objects from ccache, or ~4 min of compiling) and install it into a fresh virtual environment"
rm -rf build/venv build/wheel
env "${with_ccache[@]}" "$python" -m pip wheel --quiet --no-deps --wheel-dir build/wheel -C build-dir=build-pip .
"$python" -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-deps --force-reinstall build/wheel/mhsa-*.whl
(cd build && venv/bin/python -c "import mhsa, numpy as np; x = np.ones((1, 3, 8), np.float32); \
assert mhsa.MultiHeadAttention(8, 2)(x).shape == (1, 3, 8); print('wheel ok:', mhsa.__file__)")

step "building the fuzzers (clang, libFuzzer + ASan + UBSan, tests/fuzz/CMakeLists.txt: each parser compiled once, ~3 min)"
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz
# fuzz NAME SECONDS [VAR=VALUE...]: runs build-fuzz/fuzz_NAME on a fresh copy of its seed corpus.
fuzz() {
  local name=$1 seconds=$2 seeds=tests/fuzz/$1_corpus
  shift 2
  [ "$name" = safetensors ] && seeds=tests/fuzz/corpus
  rm -rf "build-fuzz/${name}_corpus" && cp -r "$seeds" "build-fuzz/${name}_corpus"
  env "$@" "build-fuzz/fuzz_$name" -max_total_time="$seconds" -print_final_stats=1 "build-fuzz/${name}_corpus" 2>&1 | tail -n 3
}
step "fuzzing the safetensors reader (30 s)"
fuzz safetensors 30
step "fuzzing the GGUF reader, its model mapping and its tokenizer: GgufFile::parse, tensor loading, GgufModelFile::config_of, gguf_tokenizer (15 s)"
fuzz gguf 15
step "fuzzing the tokenizer: any bytes encode and decode back (20 s)"
fuzz tokenizer 20 MHSA_TOKENIZER_DIR=tests/data/gpt2-tokenizer
step "fuzzing config.json and index reading: Gpt2Config::parse, ModelConfig::parse, parse_safetensors_index (15 s)"
fuzz config 15
step "fuzzing chat templates: ChatTemplate parse + render (15 s)"
fuzz jinja 15
step "fuzzing the tokenizer's vocab.json + merges.txt loading: Tokenizer::parse (15 s)"
fuzz tokenizer_files 15
step "fuzzing tokenizer.json loading and encoding: Tokenizer::parse_json (15 s)"
fuzz tokenizer_json 15
step "fuzzing the prompt cache's block files: check_image (15 s)"
fuzz block_image 15
step "fuzzing constrained decoding: GBNF and JSON Schema compiled, matched, masked (15 s)"
fuzz grammar 15

step "ARM (aarch64, portable kernels) under qemu"
cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMHSA_BUILD_APPS=OFF -DMHSA_BUILD_PYTHON=OFF -DMHSA_BUILD_TESTS=OFF >/dev/null
cmake --build build-arm
aarch64-linux-gnu-g++ -std=c++20 -O2 -fopenmp -Iinclude tests/arm/check.cpp build-arm/libmhsa.a -o build-arm/check
qemu-aarch64 -L /usr/aarch64-linux-gnu build-arm/check

step "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (build and run ~12 min on 2 cores)"
# -O1 -g1 (line tables): file and line in every report, at ~60% of -O2 -g's compile time.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DMHSA_SANITIZE=ON -DMHSA_BUILD_PYTHON=OFF >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure
step "all tests passed"
