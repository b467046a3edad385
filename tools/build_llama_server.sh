#!/usr/bin/env bash
# Build llama.cpp's llama-server from the source the llama-cpp-python sdist vendors, once, into
# ${SPECBENCH_CACHE:-~/.cache/specbench}/bin/llama-server (conf/server/llamacpp_ngram.yaml's default binary).
# About 10 minutes on 2 cores; does nothing when the binary is already there. Usage: bash tools/build_llama_server.sh
set -euo pipefail
VERSION=0.3.36
CACHE="${SPECBENCH_CACHE:-$HOME/.cache/specbench}"
BIN="$CACHE/bin/llama-server"
if [ -x "$BIN" ]; then echo "llama-server already built: $BIN"; exit 0; fi
WORK="$CACHE/build/llama-cpp-python-$VERSION"
mkdir -p "$WORK" "$CACHE/bin"
cd "$WORK"
[ -f "llama_cpp_python-$VERSION.tar.gz" ] || pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d .
[ -d "llama_cpp_python-$VERSION" ] || tar xf "llama_cpp_python-$VERSION.tar.gz"
cmake -S "llama_cpp_python-$VERSION/vendor/llama.cpp" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF > cmake.log
started=$(date +%s)
cmake --build build --target llama-server -j "$(nproc)" > build.log
cp build/bin/llama-server "$BIN.partial" && mv "$BIN.partial" "$BIN"
echo "built $BIN in $(( $(date +%s) - started )) s (log: $WORK/build.log)"
