#!/usr/bin/env bash
# Configures and builds mhsa (Release) into build/: the library, the `mhsa` CLI, the Python
# module in build/python and the C++ tests. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
cmake -S . -B build -G Ninja -DPython_EXECUTABLE="$("$python" -c 'import sys; print(sys.executable)')" "$@" >/dev/null
cmake --build build
