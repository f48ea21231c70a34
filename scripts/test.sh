#!/usr/bin/env bash
# Runs every test: builds, runs the C++ suite (ctest: GoogleTest, CLI, install consumer) and the
# Python suite against PyTorch (pytest), builds the Python wheel with `pip` and imports it from a
# fresh virtual environment. Meanwhile, in the background, it builds the C++ tests with
# AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), the libFuzzer targets
# (tests/fuzz/CMakeLists.txt, build-fuzz/) and the library for 64-bit ARM (portable kernels only,
# build-arm/). Then it fuzzes every parser (the safetensors reader for 30 seconds, the tokenizer for
# 20, the others for 15 each), runs tests/arm/check.cpp under qemu-aarch64 and the C++ tests again
# under the sanitizers.
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

# The sanitizer, fuzzer and ARM builds run in the background, at low priority, while the Python
# tests run: those spend much of their time waiting on servers, browsers and subprocesses, so the
# builds take the idle cores instead of ~17 min of their own. Their output goes to build/background.log.
background_builds() {
  renice -n 15 -p "$BASHPID" >/dev/null  # before the first compiler starts, so that all of them inherit it
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/)"
  # -O1 -g1 (line tables): file and line in every report, at ~60% of -O2 -g's compile time.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    -DMHSA_SANITIZE=ON -DMHSA_BUILD_PYTHON=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  echo "== fuzzers (clang, libFuzzer + ASan + UBSan, tests/fuzz/CMakeLists.txt: each parser compiled once)"
  cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ >/dev/null
  cmake --build build-fuzz -j"$jobs"
  echo "== ARM (aarch64, portable kernels)"
  cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DMHSA_BUILD_APPS=OFF -DMHSA_BUILD_PYTHON=OFF -DMHSA_BUILD_TESTS=OFF >/dev/null
  cmake --build build-arm -j"$jobs"
  aarch64-linux-gnu-g++ -std=c++20 -O2 -fopenmp -Iinclude tests/arm/check.cpp build-arm/libmhsa.a -o build-arm/check
}
step "building the sanitizer, fuzzer and ARM variants in the background (nice 15; build/background.log)"
( background_builds ) > build/background.log 2>&1 &
background=$!
# A failing step ends the run: the background builds go with it rather than outlive it.
kill_tree() { local p; for p in $(cat /proc/"$1"/task/*/children 2>/dev/null); do kill_tree "$p"; done; kill "$1" 2>/dev/null || true; }
trap 'kill_tree "$background"' EXIT

step "Python tests against PyTorch, transformers, tokenizers, tiktoken and Chromium (~8 min on 2 cores)"
PYTHONPATH="$PWD/build/python" OMP_NUM_THREADS="$jobs" MHSA_REQUIRE_BROWSER=1 "$python" -m pytest -q tests/python

step "pip wheel . (the Release build's objects from ccache, or ~4 min of compiling) and install it into a fresh virtual environment"
rm -rf build/venv build/wheel
env "${with_ccache[@]}" "$python" -m pip wheel --quiet --no-deps --wheel-dir build/wheel -C build-dir=build-pip .
"$python" -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-deps --force-reinstall build/wheel/mhsa-*.whl
(cd build && venv/bin/python -c "import mhsa, numpy as np; x = np.ones((1, 3, 8), np.float32); \
assert mhsa.MultiHeadAttention(8, 2)(x).shape == (1, 3, 8); print('wheel ok:', mhsa.__file__)")

step "waiting for the background builds"
rc=0
wait "$background" || rc=$?
tail -n 5 build/background.log
if [ "$rc" -ne 0 ]; then
  echo "the background builds failed (exit $rc); the end of build/background.log:" >&2
  tail -n 60 build/background.log >&2
  exit "$rc"
fi

# fuzz NAME SECONDS [VAR=VALUE...]: runs build-fuzz/fuzz_NAME on a fresh copy of its seed corpus;
# two at a time (each fuzzer is one thread), their last lines printed in order.
fuzz() {
  local name=$1 seconds=$2 seeds=tests/fuzz/$1_corpus
  shift 2
  [ "$name" = safetensors ] && seeds=tests/fuzz/corpus
  rm -rf "build-fuzz/${name}_corpus" && cp -r "$seeds" "build-fuzz/${name}_corpus"
  env "$@" "build-fuzz/fuzz_$name" -max_total_time="$seconds" -print_final_stats=1 "build-fuzz/${name}_corpus" \
    > "build-fuzz/${name}.log" 2>&1
}
fuzz_report() {  # fuzz_report NAME SECONDS EXIT: the last lines of its log, or of a failure more
  printf -- '-- fuzz_%s (%s s)\n' "$1" "$2"
  if [ "$3" -eq 0 ]; then tail -n 3 "build-fuzz/$1.log"; else tail -n 60 "build-fuzz/$1.log"; fi
}
fuzz_pair() {  # fuzz_pair "NAME SECONDS [VAR=VALUE...]" "NAME SECONDS [VAR=VALUE...]"
  local -a x=($1) y=($2)
  local a b rc_a=0 rc_b=0
  fuzz "${x[@]}" & a=$!
  fuzz "${y[@]}" & b=$!
  wait "$a" || rc_a=$?
  wait "$b" || rc_b=$?
  fuzz_report "${x[0]}" "${x[1]}" "$rc_a"
  fuzz_report "${y[0]}" "${y[1]}" "$rc_b"
  [ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ]
}
step "fuzzing every parser, two at a time: safetensors (30 s), the tokenizer (20 s: any bytes encode and decode back), GGUF (GgufFile::parse, tensor loading, config_of, gguf_tokenizer), config.json and index reading, chat templates, vocab.json + merges.txt, tokenizer.json, the prompt cache's block files, constrained decoding (15 s each)"
fuzz_pair "safetensors 30" "tokenizer 20 MHSA_TOKENIZER_DIR=tests/data/gpt2-tokenizer"
fuzz_pair "gguf 15" "config 15"
fuzz_pair "jinja 15" "tokenizer_files 15"
fuzz_pair "tokenizer_json 15" "block_image 15"
rc=0
fuzz grammar 15 || rc=$?
fuzz_report grammar 15 "$rc"
[ "$rc" -eq 0 ]

step "ARM (aarch64, portable kernels) under qemu"
qemu-aarch64 -L /usr/aarch64-linux-gnu build-arm/check

step "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (~4 min on 2 cores)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure
step "all tests passed"
