#!/usr/bin/env bash
# One GPU session's whole run on the device machine (README, "A GPU session's run"), inside a
# deadline: the GPU build of the GPU targets, the cuda tests and GPU benchmarks (scripts/gpu/test.sh),
# the executor bench again in bf16, the per-layer profile of GPT-2 small on the GPU and the planner's
# prediction against the measured step (bench/throughput on bench/gpt2_small_cuda.toml), then, with
# what time is left, the default job's CPU throughput on the machine's own cores. Each part
# gets what is left of the deadline and a part that does not finish does not stop the next; logs go
# to $OUT (or build-gpu/gpu-results), the benchmarks' JSON files merged into results.json.
# Exits 0 when every part ran and passed, 1 otherwise (each part's status is in the output).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

usage() {
  cat <<'EOF2'
usage: bash scripts/gpu/session.sh [SECONDS]

  SECONDS  the whole run ends within this many seconds (default 480); give the device tool's
           timeout_s some 50 s more for the machine's start and the transfers

Environment: OUT (where logs and results go; default <build>/gpu-results), OOBLECK_BUILD_DIR
(default build-gpu). Needs .gpu-deps/ (scripts/gpu/fetch-debs.sh, carried).
EOF2
}
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  "" | *[!0-9]*) [[ -z ${1:-} ]] || { echo "session: SECONDS must be a whole number, got '$1'" >&2; usage >&2; exit 2; } ;;
esac
build=${OOBLECK_BUILD_DIR:-build-gpu}
deadline=$((SECONDS + ${1:-480}))
out=${OUT:-$build/gpu-results}
mkdir -p "$out"
failed=()
exec 3>&1  # the parts' own lines reach the terminal even when a part's output goes to a log
left() { echo $((deadline - SECONDS)); }
part() {  # part NAME SECONDS_AT_MOST COMMAND...: runs COMMAND within min(SECONDS, what is left)
  local name=$1 most=$2
  shift 2
  local t=$(($(left) < most ? $(left) : most))
  ((t > 5)) || { echo "session: no time left for $name" >&3; failed+=("$name (no time)"); return 1; }
  echo "session: $name (at most $t s, $(left) s left)" >&3
  local rc=0
  timeout -k 5 "$t" "$@" || rc=$?
  echo "session: $name exited $rc; $(left) s left" >&3
  ((rc == 0)) || failed+=("$name")
  return $rc
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' || true
  c++ --version | head -1; cmake --version | head -1; nproc
} 2>&1 | tee "$out/session.log"
part build 300 bash scripts/gpu/build.sh --keep-going --target nccl_tests --target cuda_model_tests --target cuda_local_e2e_tests \
  --target gpu_executor_overhead --target gpu_nccl --target throughput --target oobleck-local --target oobleck-coordinator \
  --target oobleck-worker --target oobleck-profile >"$out/build.log" 2>&1
tail -40 "$out/build.log"
grep -E 'error|Error' "$out/build.log" | head -40
# shellcheck source=/dev/null
source "$build/env.sh" 2>/dev/null || true
OOBLECK_GPU_TEST_TIMEOUT=170 OOBLECK_GPU_BENCH_TIMEOUT=70 part tests 250 bash scripts/gpu/test.sh
rm -f "$out/ctest-cuda.xml"  # its content is in gpu-test.log; the device tool returns 8 files at most
if [[ -x $build/bench/gpu_executor_overhead ]]; then
  part bf16 60 "$build/bench/gpu_executor_overhead" --precision bf16 --json "$out/gpu_executor_overhead_bf16.json"
fi
if [[ -x $build/apps/oobleck-profile ]]; then
  part profile 60 "$build/apps/oobleck-profile" --config bench/gpt2_small_cuda.toml --repeats 20 --no-link \
    --out "$out/profile_gpt2_small_cuda.json"
fi
if [[ -x $build/bench/throughput ]]; then
  part throughput 200 "$build/bench/throughput" --config bench/gpt2_small_cuda.toml --nodes 1,2 --steps 8 \
    --warmup 2 --profile-repeats 20 --json "$out/throughput_gpt2_small_cuda.json"
fi
# Issue 26's CPU targets (efficiency against one process, the printed prediction, the overhead) on a
# machine whose cores are its own: the default job on 2 nodes, as bench/RESULTS.md measures it on the
# 2-core VM. Last, so that it takes only what the GPU parts left.
if [[ -x $build/bench/throughput ]]; then
  part cpu-throughput 90 "$build/bench/throughput" --nodes 2 --steps 60 --runs 5 --profile-at-start \
    --json "$out/throughput_cpu_default.json"
fi
# The device tool returns 8 files at most: the results' JSON files become one, results.json.
python3 - "$out" <<'EOF2' || failed+=("results.json")
import glob, json, os, sys
folder = sys.argv[1]
merged = {}
for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    if os.path.basename(path) == "results.json":
        continue
    with open(path) as f:
        merged[os.path.basename(path)] = json.load(f)
    os.remove(path)
with open(os.path.join(folder, "results.json"), "w") as f:
    json.dump(merged, f, indent=1)
print("session: results.json holds " + ", ".join(merged) if merged else "session: no results")
EOF2
if ((${#failed[@]} > 0)); then
  echo "session: failed: ${failed[*]}; $(left) s left"
  exit 1
fi
echo "session: done, nothing failed; $(left) s left"
