#!/usr/bin/env bash
# Fuzzes every decoder of outside bytes (fuzz/, cmake/fuzzing.cmake) for SECONDS each.
#
#   scripts/fuzz.sh SECONDS
#
# Configures a separate build (${OOBLECK_FUZZ_BUILD_DIR:-build-fuzz}) with clang-14, libFuzzer,
# AddressSanitizer and UBSan, builds the targets (planning/ and messages/ only: no LibTorch), and
# runs each on a scratch copy of its seed corpus fuzz/corpus/TARGET (the repository's corpus never
# grows by itself). Prints executions and findings per target; a finding's input is kept under
# BUILD/findings/TARGET/, its log in BUILD/fuzz-TARGET.log. Exit status 1 when anything was found.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: scripts/fuzz.sh SECONDS}
build=${OOBLECK_FUZZ_BUILD_DIR:-build-fuzz}

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DOOBLECK_FUZZ=ON "${launcher[@]}" >/dev/null
mapfile -t targets < "$build/fuzz/targets.txt"
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
found=0
rows=()
for t in "${targets[@]}"; do
  corpus="$scratch/$t" findings="$build/findings/$t" log="$build/fuzz-$t.log"
  rm -rf "$findings"
  mkdir -p "$corpus" "$findings"
  cp fuzz/corpus/"$t"/* "$corpus"/
  dict=()
  [[ -f fuzz/$t.dict ]] && dict=(-dict="fuzz/$t.dict")
  echo "fuzzing $t for ${seconds}s..." >&2
  # -timeout: an input that takes 10 s is a finding (a hang); -rss_limit_mb: so is 2 GiB of memory.
  "$build/fuzz/$t" "$corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1 || true
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [[ -n $execs ]] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  corpus_size=$(find "$corpus" -type f | wc -l)
  n=$(find "$findings" -type f | wc -l)
  ((n == 0)) || found=1
  rows+=("$(printf '%-16s %14s %12s %9s' "$t" "${execs:-?}" "$corpus_size" "$n")")
done

printf '\n%-16s %14s %12s %9s\n' target executions corpus findings
printf '%s\n' "${rows[@]}"
if ((found)); then
  echo "findings (reproduce: $build/fuzz/TARGET FILE):"
  find "$build/findings" -type f
fi
exit "$found"
