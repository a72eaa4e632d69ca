#!/usr/bin/env bash
# Configures and builds (Release) into ${OOBLECK_BUILD_DIR:-build}: everything, or with --main only
# the programs the main job runs (oobleck-local starts oobleck-coordinator and oobleck-worker) and
# the libraries they need, with only the packages that needs. Other arguments go to cmake's configure.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
deps=()
if [[ ${1:-} == --main ]]; then
  shift
  targets=(--target oobleck-local oobleck-coordinator oobleck-worker)
  deps=(--main)
fi
bash scripts/install-deps.sh "${deps[@]}"
build=${OOBLECK_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
