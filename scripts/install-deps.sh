#!/usr/bin/env bash
# Installs the Debian packages the project builds against, when any is missing (ARCHITECTURE.md §2, §8).
# libopenblas0 matters: without it LibTorch falls back to the reference BLAS (~15x slower).
# --main: only what building the programs and running the main job need (not the tools that only
# the tests and benchmarks run: PyTorch, chromium, gnuplot, the openssl and ip commands).
set -euo pipefail
main_only=false
[[ ${1:-} == --main ]] && main_only=true

packages=(
  g++ cmake ninja-build
  libcaf-dev            # CAF 0.17.6: actors, remote actors, heartbeats; pulls libcaf-openssl0.17 (TLS on the CAF port)
  libtorch-dev          # LibTorch 1.13.1 (CPU)
  libgloo-dev           # headers of c10d's gloo, the transport benchmark's baseline
  libcapnp-dev capnproto
  libboost-dev          # Boost.Asio 1.74
  doctest-dev
  nlohmann-json3-dev    # JSON codecs in messages/ (profiles, plan output)
  libtomlplusplus-dev   # job files
  libcli11-dev          # command-line flags
  libssl-dev            # HMAC-SHA256 and SHA-256 of the admission protocol; TLS files checked at start
  libopenblas0
  libtcmalloc-minimal4  # the programs' malloc (CMakeLists.txt, OOBLECK_ALLOCATOR): ~10% off a CPU step
)
# Run by the tests and benchmarks, and by a few programs' options, not by a build or the main job.
tools=(
  openssl               # the tests make a CA and certificates with it (README, "TLS")
  gnuplot-nox           # oobleck-sim --plot, oobleck-report --plot
  python3-torch         # PyTorch 1.13 under /usr/bin/python3: the GPT-2 reference checks (tests/python), bench/vs_pytorch
  chromium              # headless: the dashboard test (label browser)
  iproute2              # ip netns, veth pairs, a bridge: the partition test (partition_netns_e2e_tests; skipped without)
)
$main_only || packages+=("${tools[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
