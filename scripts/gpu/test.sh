#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu/build.sh (README, "GPU build"): shows the GPU, checks
# which cudart and NCCL the programs load, runs the CTest tests labelled cuda, then every GPU
# benchmark that was built (executables <build>/bench/gpu_*). Logs and results go to $OUT when it
# is set (the device tool's output folder: at most 8 files come back), else to <build>/gpu-results.
# Exits non-zero if a test or a benchmark failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  cat <<'EOF'
usage: bash scripts/gpu/test.sh [--no-bench] [--] [CTEST_ARGS...]

  --no-bench   run the tests only
  CTEST_ARGS   more arguments for ctest (-R REGEX, -V, ...)

Environment:
  OOBLECK_BUILD_DIR          the build folder (default build-gpu)
  OUT                        where logs and results go (default <build>/gpu-results)
  OOBLECK_GPU_TEST_TIMEOUT   seconds for the whole ctest run (default 420)
  OOBLECK_GPU_BENCH_TIMEOUT  seconds for each benchmark (default 300)
  OOBLECK_GPU_BENCH_ARGS     arguments for every benchmark besides --json <results>/<name>.json
EOF
}

die() {
  echo "gpu/test: $*" >&2
  exit 1
}

bench=true
ctest_args=()
while (($# > 0)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --no-bench) bench=false ;;
    --) shift; ctest_args+=("$@"); break ;;
    *) ctest_args+=("$1") ;;
  esac
  shift
done

build=${OOBLECK_BUILD_DIR:-build-gpu}
test_timeout=${OOBLECK_GPU_TEST_TIMEOUT:-420}
bench_timeout=${OOBLECK_GPU_BENCH_TIMEOUT:-300}
[[ -f $build/env.sh && -f $build/CMakeCache.txt ]] || die "no $build/env.sh: run 'bash scripts/gpu/build.sh' first"
# shellcheck source=/dev/null
source "$build/env.sh"
results=${OUT:-$build/gpu-results}
mkdir -p "$results"
log=$results/gpu-test.log
: >"$log"

say() { echo "gpu/test: $*" | tee -a "$log"; }
# Runs "$@", its output to the terminal and the log; returns its status (call it as 'logged ... || rc=$?').
logged() {
  "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

say "build $build, results in $results"
if command -v nvidia-smi >/dev/null; then
  logged nvidia-smi -L || say "warning: nvidia-smi -L failed"
else
  say "warning: nvidia-smi is not on PATH"
fi

# One cudart and one NCCL: those of the wheel (build.sh linked them and put them on LD_LIBRARY_PATH).
worker=$(find "$build" -name oobleck-worker -type f -perm -u+x 2>/dev/null | head -1)
if [[ -n $worker ]]; then
  say "libraries $worker loads:"
  logged bash -c "ldd '$worker' | grep -E 'libcudart|libnccl|libtorch_cuda|libc10_cuda|libcaf_core|not found'" || true
  if ldd "$worker" | grep -q 'not found'; then
    say "warning: some libraries of $worker are not found (see above)"
  fi
fi

failed=()
# ---- Tests labelled cuda ---------------------------------------------------------------------------
count=$(ctest --test-dir "$build" -N -L cuda "${ctest_args[@]}" | awk '/^Total Tests:/ {print $3}')
if [[ ${count:-0} == 0 ]]; then
  say "no CTest test carries the label cuda (yet): no GPU test to run"
else
  say "running $count test(s) labelled cuda (at most ${test_timeout} s)"
  junit=()
  if ctest --help | grep -q -- --output-junit; then
    junit=(--output-junit "$(realpath "$results")/ctest-cuda.xml")
  fi
  rc=0
  logged timeout -k 10 "$test_timeout" ctest --test-dir "$build" -L cuda --output-on-failure "${junit[@]}" "${ctest_args[@]}" || rc=$?
  if ((rc == 124 || rc == 137)); then
    say "FAILED: the cuda tests ran past ${test_timeout} s (OOBLECK_GPU_TEST_TIMEOUT)"
    failed+=("ctest -L cuda (timeout)")
  elif ((rc != 0)); then
    say "FAILED: ctest -L cuda exited with $rc"
    failed+=("ctest -L cuda")
  fi
  if ((rc != 0)) && [[ -f $build/Testing/Temporary/LastTest.log ]]; then
    cp "$build/Testing/Temporary/LastTest.log" "$results/ctest-LastTest.log"
  fi
fi

# ---- GPU benchmarks --------------------------------------------------------------------------------
if $bench; then
  mapfile -t benches < <(find "$build/bench" -maxdepth 1 -type f -name 'gpu_*' -perm -u+x 2>/dev/null | sort)
  if ((${#benches[@]} == 0)); then
    say "no GPU benchmark was built (no executable $build/bench/gpu_*): none to run"
  fi
  read -r -a bench_args <<<"${OOBLECK_GPU_BENCH_ARGS:-}"
  for b in "${benches[@]}"; do
    name=$(basename "$b")
    say "benchmark $name (at most ${bench_timeout} s)"
    rc=0
    logged timeout -k 10 "$bench_timeout" "$b" --json "$results/$name.json" "${bench_args[@]}" || rc=$?
    if ((rc != 0)); then
      say "FAILED: $name exited with $rc$( ((rc == 124 || rc == 137)) && echo " (past ${bench_timeout} s)")"
      failed+=("$name")
    fi
  done
fi

if ((${#failed[@]} > 0)); then
  say "failed: ${failed[*]}"
  exit 1
fi
say "done: nothing failed"
