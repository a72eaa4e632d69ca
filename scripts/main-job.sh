#!/usr/bin/env bash
# The main job. Until the local cluster exists (actors, runtime), it plans a job on the shipped
# example profile and replays a failure and a join through the reconfiguration policy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec "${OOBLECK_BUILD_DIR:-build}"/apps/oobleck-plan \
  --profile examples/profiles/gpt-synthetic-24l.json \
  --nodes 8 --fault-tolerance 1 --global-batch 256 --microbatch 4 \
  --fail 3 --join 1 "$@"
