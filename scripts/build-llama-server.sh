#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the real engine of tests/gateway/test_real_engine.py) from
# source and caches it under ${FLOTILLA_CACHE:-~/.cache/flotilla}/llama-server-<version>/, keyed
# by the pinned version; prints the binary's path. A no-op (one line of output) when cached.
#
# The source is the PyPI source distribution of `llama-cpp-python`, which vendors the whole of
# llama.cpp (`vendor/llama.cpp`: tools/server, the gguf-py writer, vocab-only GGUF files under
# models/), fetched with pip: nothing outside the package registries. The unpacked tree stays in
# the cache next to the binary: scripts/make-test-gguf.py takes its gguf-py and vocabulary there.
# CPU only, no web UI, no TLS, static; on 2 cores the build takes about 8 minutes.
# FLOTILLA_LLAMA_NICE=10 runs the compiler under `nice` (when other builds share the machine).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
DIR="$CACHE/llama-server-$LLAMA_CPP_PYTHON_VERSION"
BIN="$DIR/bin/llama-server"
SRC="$DIR/src"

if [ -x "$BIN" ] && [ -d "$SRC/vendor/llama.cpp/gguf-py" ]; then
  echo "$BIN"
  exit 0
fi

if ! command -v cmake >/dev/null 2>&1; then
  echo "build-llama-server: installing cmake (Debian package)" >&2
  sudo_=""
  [[ $(id -u) -eq 0 ]] || sudo_="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_ apt-get install -y -qq cmake >/dev/null ||
    { $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq cmake >/dev/null; }
  command -v cmake >/dev/null || { echo "build-llama-server: cmake is still missing" >&2; exit 1; }
fi

mkdir -p "$DIR"
work=$(mktemp -d "$DIR/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "build-llama-server: fetching the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist from PyPI" >&2
python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
  --dest "$work" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
rm -rf "$SRC"
mv "$work"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION" "$SRC"

nice_=()
[[ -z "${FLOTILLA_LLAMA_NICE:-}" ]] || nice_=(nice -n "$FLOTILLA_LLAMA_NICE")
echo "build-llama-server: building llama-server (about 8 minutes on 2 cores)" >&2
start=$SECONDS
cmake -S "$SRC/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE=OFF >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; exit 1; }
"${nice_[@]}" cmake --build "$work/build" --target llama-server -j"$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log" >&2; exit 1; }
mkdir -p "$DIR/bin"
cp "$work/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "build-llama-server: built in $((SECONDS - start)) s" >&2
echo "$BIN"
