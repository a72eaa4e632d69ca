#!/usr/bin/env bash
# The main job: installs packages, builds, then trains the default job on a local cluster (a
# coordinator and 6 worker processes on 127.0.0.1, pipelines spanning nodes) and kills worker
# node 2 in the middle of step 8: the survivors re-form their pipelines from the templates, copy
# the missing layers (with their optimizer state) from surviving replicas, run step 8 again and
# train on. Extra arguments go to oobleck-local (see oobleck-local --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --main   # the three programs it runs, not the tests and benchmarks
exec "${OOBLECK_BUILD_DIR:-build}"/apps/oobleck-local --fail-at 8:2 "$@"
