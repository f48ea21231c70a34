#!/usr/bin/env bash
# bench/llama_cpp_peer.sh -- measure the peer engine, llama.cpp, on this machine.
#
# What: builds llama.cpp's `llama-bench` (CPU only, Release, -march=native via
# GGML_NATIVE; and `llama-server` when asked) and runs it on a model with RANDOM
# weights stored as an F32 GGUF
# (GPT-2 124M by default; SmolLM2-135M's shape with MHSA_PEER_ARCH=smollm2; or
# any Hugging Face directory given as MHSA_PEER_HF_DIR), then prints one JSON
# line to stdout:
#   {"llama_cpp_version": ..., "pp512_tokens_per_s": ..., "tg128_tokens_per_s": ...,
#    "threads": N, ...stddev/samples...}
# Progress messages and llama-bench's markdown table go to stderr.
#
# Why: mhsa's GPT-2 runner is compared against llama.cpp on the same hardware,
# same model shape and same precision (F32), so the peer numbers must be
# reproducible here rather than quoted from elsewhere.
#
# How, without GitHub or a model hub (only PyPI and Debian are reachable):
#   1. llama.cpp source comes from PyPI: the llama-cpp-python sdist vendors it
#      under vendor/llama.cpp. The version and the sdist's sha256 are pinned
#      below; the matching llama.cpp commit is taken from that release's
#      CHANGELOG ("update llama.cpp to ggml-org/llama.cpp@<commit>").
#   2. cmake builds only the targets asked for (llama-bench by default; the
#      configuration includes llama-server, without its web UI; -j2 by default).
#   3. bench/random_hf_model.py writes the model directory with transformers'
#      save_pretrained (seed 0; GPT2LMHeadModel(GPT2Config()) with the GPT-2
#      tokenizer files, or SmolLM2-135M's LlamaForCausalLM shape with a
#      stand-in tokenizer of its vocabulary size), unless MHSA_PEER_HF_DIR names
#      one; the vendored convert_hf_to_gguf.py (with the vendored gguf-py on
#      PYTHONPATH) writes the F32 GGUF (or --outtype MHSA_PEER_OUTTYPE). The
#      directory is kept: mhsa reads the same one (bench/compare_llama_cpp.py).
#   4. llama-bench -p 512 -n 128 -o json, summarised with python3.
#
# Every step is cached under $MHSA_PEER_DIR (default: <repo>/build/peer) and
# skipped when already done, so a second run only re-runs the benchmark.
#
# Environment:
#   MHSA_PEER_DIR      cache dir (default <repo>/build/peer)
#   MHSA_PEER_THREADS  llama-bench threads (default 2)
#   MHSA_PEER_REPS     llama-bench repetitions (default 5)
#   MHSA_PEER_JOBS     build parallelism (default 2)
#   MHSA_PEER_ARCH     gpt2 (default) or smollm2: the random model to write
#   MHSA_PEER_HF_DIR   a Hugging Face model directory to convert instead
#   MHSA_PEER_TARGETS  llama.cpp targets to build (default "llama-bench"; e.g.
#                      "llama-server", "llama-lookup" (bench/speculative.py), or
#                      "llama" for the library alone)
#   MHSA_PEER_OUTTYPE  the converter's --outtype: f32 (default), f16, bf16, q8_0
#   MHSA_PEER_GGUF     a GGUF file to run as it is (no model directory, no
#                      conversion: e.g. a downloaded Q4_1 file); hf_dir is ""
#   MHSA_PEER_NO_BENCH 1: build and convert only, then print one JSON line
#                      {"llama_cpp_version", "src_dir", "build_dir", "bin_dir",
#                      "hf_dir", "gguf"}
#                      (bench/greedy_vs_llama_cpp.py, bench/serve_load.py --peer)
#
# Needs: python3 with pip, torch, transformers, safetensors, numpy, pyyaml,
# tqdm, requests (and sentencepiece for Llama-family models: the converter
# imports it before looking for a tokenizer.model); cmake >= 3.14; a C/C++17
# compiler; tar; sha256sum.
set -euo pipefail

# ---- pinned peer version ----------------------------------------------------
LCP_VERSION="0.3.36"                       # llama-cpp-python sdist on PyPI
LCP_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_COMMIT="0c1e57098"                   # ggml-org/llama.cpp commit it vendors

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
PEER_DIR="${MHSA_PEER_DIR:-$REPO_DIR/build/peer}"
THREADS="${MHSA_PEER_THREADS:-2}"
REPS="${MHSA_PEER_REPS:-5}"
JOBS="${MHSA_PEER_JOBS:-2}"
TARGETS="${MHSA_PEER_TARGETS:-llama-bench}"
OUTTYPE="${MHSA_PEER_OUTTYPE:-f32}"
if [[ "${MHSA_PEER_NO_BENCH:-0}" != 1 && " $TARGETS " != *" llama-bench "* ]]; then
    TARGETS="$TARGETS llama-bench"
fi

SDIST="llama_cpp_python-${LCP_VERSION}.tar.gz"
SRC_DIR="$PEER_DIR/llama.cpp-$LLAMA_COMMIT"
BUILD_DIR="$PEER_DIR/build-llama-$LLAMA_COMMIT"
BENCH_BIN="$BUILD_DIR/bin/llama-bench"
ARCH="${MHSA_PEER_ARCH:-gpt2}"
HF_DIR="$(realpath -m "${MHSA_PEER_HF_DIR:-$PEER_DIR/$ARCH-random-hf}")"
GGUF="$PEER_DIR/$(basename "$HF_DIR")-$OUTTYPE.gguf"
if [[ -n "${MHSA_PEER_GGUF:-}" ]]; then
    GGUF="$(realpath -m "$MHSA_PEER_GGUF")"
    HF_DIR=""
fi

log() { printf '[llama_cpp_peer] %s\n' "$*" >&2; }

mkdir -p "$PEER_DIR"

# ---- 1. source from PyPI ----------------------------------------------------
if [[ ! -f "$SRC_DIR/.mhsa-unpacked" ]]; then
    if [[ ! -f "$PEER_DIR/$SDIST" ]] || \
       ! echo "$LCP_SHA256  $PEER_DIR/$SDIST" | sha256sum --check --status; then
        log "downloading llama-cpp-python==$LCP_VERSION sdist from PyPI (~77 MB)"
        rm -f "$PEER_DIR/$SDIST"
        python3 -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$LCP_VERSION" -d "$PEER_DIR" >&2
    fi
    echo "$LCP_SHA256  $PEER_DIR/$SDIST" | sha256sum --check --status \
        || { log "sha256 mismatch for $SDIST"; exit 1; }
    log "unpacking vendor/llama.cpp into $SRC_DIR"
    rm -rf "$SRC_DIR" "$SRC_DIR.tmp"
    mkdir -p "$SRC_DIR.tmp"
    tar -xzf "$PEER_DIR/$SDIST" -C "$SRC_DIR.tmp" --strip-components=3 \
        "llama_cpp_python-${LCP_VERSION}/vendor/llama.cpp"
    # The sdist keeps the submodule's ".git" file, pointing at a gitdir that is
    # not shipped; drop it so nothing mistakes the tree for a git checkout.
    rm -f "$SRC_DIR.tmp/.git"
    touch "$SRC_DIR.tmp/.mhsa-unpacked"
    mv "$SRC_DIR.tmp" "$SRC_DIR"
else
    log "source cached: $SRC_DIR"
fi

# ---- 2. build the targets -----------------------------------------------------
# (A cache configured before llama-server was included is configured again.)
if ! grep -q '^LLAMA_BUILD_SERVER:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
    log "configuring llama.cpp (Release, CPU, GGML_NATIVE=ON)"
    # Git is pointed at /bin/false: the tree has no git metadata, and the cache
    # dir may sit inside mhsa's own repo, whose commit must not be reported.
    # The server is built without its web UI (no npm, no download: an empty
    # asset table), which the HTTP API does not need.
    cmake -S "$SRC_DIR" -B "$BUILD_DIR" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_COMMIT="$LLAMA_COMMIT" \
        -DGIT_EXECUTABLE=/bin/false -DGIT_EXE=/bin/false \
        >"$PEER_DIR/cmake-configure.log" 2>&1 \
        || { log "configure failed, see $PEER_DIR/cmake-configure.log"; tail -30 "$PEER_DIR/cmake-configure.log" >&2; exit 1; }
fi
for target in $TARGETS; do
    if [[ ! -x "$BUILD_DIR/bin/$target" && ! -f "$BUILD_DIR/src/lib$target.a" ]]; then
        log "building $TARGETS with -j$JOBS (several minutes on 2 cores)"
        t0=$(date +%s)
        break
    fi
done
# Always invoke the build: a no-op when up to date, and it repairs a partial one.
# shellcheck disable=SC2086 # one word per target
cmake --build "$BUILD_DIR" --target $TARGETS -j"$JOBS" \
    >"$PEER_DIR/cmake-build.log" 2>&1 \
    || { log "build failed, see $PEER_DIR/cmake-build.log"; tail -30 "$PEER_DIR/cmake-build.log" >&2; exit 1; }
if [[ -n "${t0:-}" ]]; then
    log "built $TARGETS in $(( $(date +%s) - t0 )) s"
fi

# ---- 3. the model directory and its F32 GGUF --------------------------------
if [[ -n "${MHSA_PEER_GGUF:-}" ]]; then
    [[ -f "$GGUF" ]] || { log "MHSA_PEER_GGUF=$GGUF: no such file"; exit 1; }
    log "model given: $GGUF"
elif [[ ! -f "$HF_DIR/config.json" ]]; then
    [[ -z "${MHSA_PEER_HF_DIR:-}" ]] || { log "MHSA_PEER_HF_DIR=$HF_DIR has no config.json"; exit 1; }
    log "writing a random $ARCH model (seed 0) to $HF_DIR"
    python3 "$SCRIPT_DIR/random_hf_model.py" --arch "$ARCH" "$HF_DIR.tmp" >&2
    mv "$HF_DIR.tmp" "$HF_DIR"
fi
if [[ -n "${MHSA_PEER_GGUF:-}" ]]; then
    :
elif [[ ! -f "$GGUF" || "$GGUF" -ot "$HF_DIR/config.json" ]]; then
    log "converting $HF_DIR to $OUTTYPE GGUF with the vendored convert_hf_to_gguf.py"
    PYTHONPATH="$SRC_DIR/gguf-py${PYTHONPATH:+:$PYTHONPATH}" \
        python3 "$SRC_DIR/convert_hf_to_gguf.py" "$HF_DIR" \
        --outtype "$OUTTYPE" --outfile "$GGUF.tmp" >"$PEER_DIR/convert.log" 2>&1 \
        || { log "conversion failed, see $PEER_DIR/convert.log"; tail -30 "$PEER_DIR/convert.log" >&2; exit 1; }
    mv "$GGUF.tmp" "$GGUF"
else
    log "model cached: $GGUF"
fi

if [[ "${MHSA_PEER_NO_BENCH:-0}" == 1 ]]; then
    python3 -c 'import json, sys; print(json.dumps(dict(zip(
        ["llama_cpp_version", "src_dir", "build_dir", "bin_dir", "hf_dir", "gguf"], sys.argv[1:]))))' \
        "ggml-org/llama.cpp@$LLAMA_COMMIT (vendored in llama-cpp-python $LCP_VERSION)" \
        "$SRC_DIR" "$BUILD_DIR" "$BUILD_DIR/bin" "$HF_DIR" "$GGUF"
    exit 0
fi

# ---- 4. benchmark -----------------------------------------------------------
# The cores may be shared: sample whole-machine CPU use for 2 s first, so a
# number taken on a busy machine is flagged rather than mistaken for the peer's.
cpu_busy_pct() {
    local a b
    read -r -a a < <(head -1 /proc/stat); sleep 2; read -r -a b < <(head -1 /proc/stat)
    local tot=0 k
    for k in 1 2 3 4 5 6 7 8; do tot=$(( tot + b[k] - a[k] )); done
    echo $(( tot > 0 ? 100 * (tot - (b[4] - a[4])) / tot : 0 ))
}
BUSY=$(cpu_busy_pct)
if (( BUSY > 20 )); then
    log "WARNING: machine already ${BUSY}% busy before the benchmark; numbers will be low and noisy"
fi
log "running llama-bench -t $THREADS -p 512 -n 128 -r $REPS"
RESULT_JSON="$PEER_DIR/llama-bench-result.json"
"$BENCH_BIN" -m "$GGUF" -t "$THREADS" -p 512 -n 128 -r "$REPS" \
    -o json -oe md >"$RESULT_JSON"

python3 - "$RESULT_JSON" "$LCP_VERSION" "$LLAMA_COMMIT" "$THREADS" "$BUSY" "$HF_DIR" "$GGUF" <<'PY'
import json, os, sys
path, lcp, commit, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
busy, hf_dir, gguf = int(sys.argv[5]), sys.argv[6], sys.argv[7]
weights = "random weights" if hf_dir and not os.environ.get("MHSA_PEER_HF_DIR") else os.path.basename(gguf)
rows = json.load(open(path))
def pick(n_prompt, n_gen):
    for r in rows:
        if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen:
            return r
    raise SystemExit(f"llama-bench result lacks pp{n_prompt}/tg{n_gen}")
pp, tg = pick(512, 0), pick(0, 128)
r2 = lambda x: round(float(x), 2)
print(json.dumps({
    "llama_cpp_version": f"ggml-org/llama.cpp@{pp.get('build_commit') or commit} "
                         f"(vendored in llama-cpp-python {lcp})",
    "pp512_tokens_per_s": r2(pp["avg_ts"]),
    "tg128_tokens_per_s": r2(tg["avg_ts"]),
    "threads": threads,
    "pp512_stddev": r2(pp["stddev_ts"]),
    "tg128_stddev": r2(tg["stddev_ts"]),
    "pp512_samples": [r2(x) for x in pp.get("samples_ts", [])],
    "tg128_samples": [r2(x) for x in tg.get("samples_ts", [])],
    "model": f"{pp.get('model_type', '?')} {weights}, {pp.get('model_size', 0)/2**20:.0f} MiB",
    "cpu": pp.get("cpu_info", ""),
    "cpu_busy_pct_before": busy,
    "hf_dir": hf_dir,
    "gguf": gguf,
}))
PY
