#!/usr/bin/env bash
# The main job: installs packages, builds, then trains the default job on a local cluster (a
# coordinator and 6 worker processes on 127.0.0.1, pipelines spanning nodes), and replays a node
# failure and a join through the planner. Recovery inside the running cluster (kill a worker,
# re-instantiate, copy layers, go on) is not built yet: until it is, the failure is shown as the
# planner's decision, not injected into the training.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build="${OOBLECK_BUILD_DIR:-build}"
"$build"/apps/oobleck-local "$@"
echo
echo "== the planner's answer to node 3 failing and one node joining (8 nodes, f = 1):"
"$build"/apps/oobleck-plan \
  --profile examples/profiles/gpt-synthetic-24l.json \
  --nodes 8 --fault-tolerance 1 --global-batch 256 --microbatch 4 \
  --fail 3 --join 1
