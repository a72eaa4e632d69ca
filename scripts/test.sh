#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every CTest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir "${OOBLECK_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
