#!/usr/bin/env bash
# Runs every test: builds, runs the C++ suite (ctest: GoogleTest, CLI, install consumer) and the
# Python suite against PyTorch (pytest), builds the Python wheel with `pip` and imports it from a
# fresh virtual environment, then rebuilds the C++ tests with AddressSanitizer +
# UndefinedBehaviorSanitizer into build-asan/ and runs them again. Before that it fuzzes the
# safetensors reader for 30 seconds, the tokenizer for 20, config.json and the tokenizer's files
# for 15 each, and tokenizer.json files for 15 (tests/fuzz), cross-builds the library for 64-bit ARM (portable kernels only) and
# runs tests/arm/check.cpp under qemu-aarch64.
# Run scripts/setup.sh --test first.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
jobs=$(nproc)
start=$(date +%s)
# Prints a step's name with the time since the start, so a long silent step is never a mystery.
step() { local t=$(( $(date +%s) - start )); printf '\n== [%d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*"; }

step "build (Release, into build/; a fresh build takes ~3 min on 2 cores)"
scripts/build.sh

step "C++ tests"
ctest --test-dir build -j"$jobs" --output-on-failure

step "Python tests against PyTorch, transformers, tokenizers, tiktoken and Chromium (~2 min on 2 cores)"
PYTHONPATH="$PWD/build/python" OMP_NUM_THREADS="$jobs" MHSA_REQUIRE_BROWSER=1 "$python" -m pytest -q tests/python

step "pip wheel . (compiles the module again, ~2 min on 2 cores) and install it into a fresh virtual environment"
rm -rf build/venv build/wheel
"$python" -m pip wheel --quiet --no-deps --wheel-dir build/wheel .
"$python" -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-deps --force-reinstall build/wheel/mhsa-*.whl
(cd build && venv/bin/python -c "import mhsa, numpy as np; x = np.ones((1, 3, 8), np.float32); \
assert mhsa.MultiHeadAttention(8, 2)(x).shape == (1, 3, 8); print('wheel ok:', mhsa.__file__)")

step "fuzzing the safetensors reader (libFuzzer + ASan + UBSan, 30 s)"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/safetensors_fuzz.cpp \
  src/io/safetensors.cpp src/io/file.cpp src/io/json.cpp src/core/error.cpp src/core/tensor.cpp -o build/fuzz_safetensors
rm -rf build/fuzz_corpus && cp -r tests/fuzz/corpus build/fuzz_corpus
build/fuzz_safetensors -max_total_time=30 -print_final_stats=1 build/fuzz_corpus 2>&1 | tail -n 3

JINJA_SOURCES="src/text/chat_template.cpp src/text/jinja_parse.cpp src/text/jinja_eval.cpp src/text/jinja_lex.cpp
  src/text/jinja_values.cpp src/text/jinja_builtins.cpp"
TOKENIZER_SOURCES="src/text/tokenizer.cpp src/text/hf_tokenizer.cpp src/text/hf_components.cpp src/text/bpe.cpp src/text/word_cache.cpp src/text/regex.cpp src/text/unicode.cpp
  src/text/unicode_data.cpp src/text/unicode_props.cpp $JINJA_SOURCES src/io/file.cpp src/io/json.cpp src/io/checkpoint_dir.cpp
  src/core/error.cpp"
step "fuzzing the tokenizer: any bytes encode and decode back (libFuzzer + ASan + UBSan, 20 s)"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/tokenizer_fuzz.cpp \
  $TOKENIZER_SOURCES -o build/fuzz_tokenizer
rm -rf build/fuzz_tokenizer_corpus && cp -r tests/fuzz/tokenizer_corpus build/fuzz_tokenizer_corpus
MHSA_TOKENIZER_DIR=tests/data/gpt2-tokenizer \
  build/fuzz_tokenizer -max_total_time=20 -print_final_stats=1 build/fuzz_tokenizer_corpus 2>&1 | tail -n 3

step "fuzzing config.json and index reading: Gpt2Config::parse, ModelConfig::parse, parse_safetensors_index (libFuzzer + ASan + UBSan, 15 s)"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/config_fuzz.cpp \
  src/model/gpt2_config.cpp src/model/model_config.cpp src/io/sharded_safetensors.cpp src/io/safetensors.cpp \
  src/io/file.cpp src/io/json.cpp src/core/error.cpp src/core/tensor.cpp -o build/fuzz_config
rm -rf build/fuzz_config_corpus && cp -r tests/fuzz/config_corpus build/fuzz_config_corpus
build/fuzz_config -max_total_time=15 -print_final_stats=1 build/fuzz_config_corpus 2>&1 | tail -n 3

step "fuzzing chat templates: ChatTemplate parse + render (libFuzzer + ASan + UBSan, 15 s)"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/jinja_fuzz.cpp \
  $JINJA_SOURCES src/io/json.cpp src/core/error.cpp -o build/fuzz_jinja
rm -rf build/fuzz_jinja_corpus && cp -r tests/fuzz/jinja_corpus build/fuzz_jinja_corpus
build/fuzz_jinja -max_total_time=15 -print_final_stats=1 build/fuzz_jinja_corpus 2>&1 | tail -n 3

step "fuzzing the tokenizer's vocab.json + merges.txt loading: Tokenizer::parse (libFuzzer + ASan + UBSan, 15 s)"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/tokenizer_files_fuzz.cpp \
  $TOKENIZER_SOURCES \
  -o build/fuzz_tokenizer_files
rm -rf build/fuzz_tokenizer_files_corpus && cp -r tests/fuzz/tokenizer_files_corpus build/fuzz_tokenizer_files_corpus
build/fuzz_tokenizer_files -max_total_time=15 -print_final_stats=1 build/fuzz_tokenizer_files_corpus 2>&1 | tail -n 3

step "fuzzing tokenizer.json loading and encoding: Tokenizer::parse_json (libFuzzer + ASan + UBSan, 15 s)"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/tokenizer_json_fuzz.cpp \
  $TOKENIZER_SOURCES -o build/fuzz_tokenizer_json
rm -rf build/fuzz_tokenizer_json_corpus && cp -r tests/fuzz/tokenizer_json_corpus build/fuzz_tokenizer_json_corpus
build/fuzz_tokenizer_json -max_total_time=15 -print_final_stats=1 build/fuzz_tokenizer_json_corpus 2>&1 | tail -n 3

step "ARM (aarch64, portable kernels) under qemu"
cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMHSA_BUILD_APPS=OFF -DMHSA_BUILD_PYTHON=OFF -DMHSA_BUILD_TESTS=OFF >/dev/null
cmake --build build-arm
aarch64-linux-gnu-g++ -std=c++20 -O2 -fopenmp -Iinclude tests/arm/check.cpp build-arm/libmhsa.a -o build-arm/check
qemu-aarch64 -L /usr/aarch64-linux-gnu build-arm/check

step "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (build and run ~9 min on 2 cores)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMHSA_SANITIZE=ON -DMHSA_BUILD_PYTHON=OFF >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure
step "all tests passed"
