#!/usr/bin/env bash
# Downloads (apt-get download, nothing is installed) the Debian bookworm .deb files that the GPU
# build needs and the GPU machine lacks, into .gpu-deps/ (ignored by git). Run it here, on the Debian
# machine, as root or with sudo; then name .gpu-deps in the device tool's carry and run
# scripts/gpu/build.sh there, which unpacks them under /tmp (README, "GPU build").
# Idempotent: a package whose candidate version is already in the folder is not downloaded again,
# and older versions of it are removed. Fails if the folder would not fit the carry limit.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  cat <<'EOF'
usage: bash scripts/gpu/fetch-debs.sh [--help]

Downloads the .deb files of CAF 0.17, Cap'n Proto 0.9.2 (libraries and the capnp compiler),
Boost 1.74 headers, toml++, CLI11, nlohmann-json, doctest, OpenSSL and pkgconf into .gpu-deps/.
Environment: OOBLECK_GPU_DEPS_MAX_MIB (default 55): the largest size allowed for .gpu-deps/.
EOF
}
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  "") ;;
  *) echo "fetch-debs: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac

dest=.gpu-deps
max_mib=${OOBLECK_GPU_DEPS_MAX_MIB:-55}

# Runtime libraries are named too: apt-get download fetches exactly the packages named.
packages=(
  libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17   # CAF 0.17.6 (core, io, openssl)
  libcapnp-dev libcapnp-0.9.2 capnproto                          # Cap'n Proto: headers, libraries, capnp
  libboost1.74-dev                                               # Boost.Asio/Beast headers + CMake config
  libtomlplusplus-dev libtomlplusplus3                           # toml++ (a compiled library on Debian)
  libcli11-dev nlohmann-json3-dev doctest-dev                    # header-only
  libssl-dev libssl3                                             # OpenSSL 3.0 headers and libraries
  pkgconf-bin libpkgconf3                                        # Cap'n Proto's CMake config runs pkg-config
)

command -v apt-get >/dev/null || { echo "fetch-debs: apt-get not found: run this on the Debian build machine" >&2; exit 1; }
arch=$(dpkg --print-architecture)
if [[ $arch != amd64 ]]; then
  echo "fetch-debs: this machine is $arch; the GPU machine is amd64 (x86-64): run this on an amd64 Debian machine" >&2
  exit 1
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "fetch-debs: need root or sudo for apt-get update" >&2; exit 1; }
  sudo="sudo"
fi

candidate() { apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}'; }
c=$(candidate libcaf-dev)
if [[ -z $c || $c == "(none)" ]]; then
  echo "fetch-debs: no candidate for libcaf-dev: apt-get update" >&2
  $sudo apt-get update -qq
fi

# One apt call gives each candidate's exact file name and size.
if ! uris=$(apt-get download --print-uris -qq "${packages[@]}" 2>&1); then
  echo "fetch-debs: apt cannot find some of the packages (is this Debian bookworm with its main repository?):" >&2
  echo "$uris" >&2
  exit 1
fi
mkdir -p "$dest"
wanted=()
missing=()
while read -r _uri file size _hash; do
  [[ $file == *.deb ]] || continue
  wanted+=("$file")
  if [[ ! -f $dest/$file || $(stat -c %s "$dest/$file") != "$size" ]]; then
    missing+=("${file%%_*}")
  fi
done <<<"$uris"
if ((${#wanted[@]} != ${#packages[@]})); then
  echo "fetch-debs: expected ${#packages[@]} files from apt-get download --print-uris, got ${#wanted[@]}:" >&2
  echo "$uris" >&2
  exit 1
fi
# Older versions of the same packages (and anything else) go.
for f in "$dest"/*.deb; do
  [[ -e $f ]] || continue
  keep=false
  for w in "${wanted[@]}"; do [[ $(basename "$f") == "$w" ]] && keep=true; done
  if ! $keep; then
    echo "fetch-debs: removing $(basename "$f") (not a current candidate)"
    rm -f "$f"
  fi
done
if ((${#missing[@]} > 0)); then
  # As root, apt's sandbox user could not write here; download as the calling user instead.
  (cd "$dest" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" "${missing[@]}")
fi
for w in "${wanted[@]}"; do
  [[ -s $dest/$w ]] || { echo "fetch-debs: apt-get download did not write $dest/$w" >&2; exit 1; }
done
fetched=${#missing[@]}

debs=("$dest"/*.deb)
total=$(du -cb "${debs[@]}" | awk 'END {print $1}')
mib=$(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}')
echo "fetch-debs: $dest holds ${#debs[@]} .deb files, $mib MiB ($fetched downloaded now)"
if ((total > max_mib * 1048576)); then
  echo "fetch-debs: $dest is $mib MiB, over the $max_mib MiB allowed (OOBLECK_GPU_DEPS_MAX_MIB): the working tree and" \
    "the carried paths must stay under 64 MiB together" >&2
  exit 1
fi
if git rev-parse --git-dir >/dev/null 2>&1; then
  tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | awk 'END {print $1}')
  echo "fetch-debs: the working tree that travels (tracked and untracked-not-ignored files) is" \
    "$(awk -v b="$tree" 'BEGIN {printf "%.1f", b / 1048576}') MiB; with $dest: $(awk -v b="$((tree + total))" 'BEGIN {printf "%.1f", b / 1048576}') MiB of 64"
fi
