#!/usr/bin/env bash
# The GPU build, run on the GPU machine from the repository root (README, "GPU build"): unpacks the
# Debian packages that scripts/gpu/fetch-debs.sh put in .gpu-deps/ under a prefix in /tmp (never
# into /), builds against the LibTorch of the PyTorch wheel that python3 imports, with the wheel's
# own cudart and NCCL (one of each in a process), and -DOOBLECK_WITH_CUDA=ON, into
# ${OOBLECK_BUILD_DIR:-build-gpu}. It writes <build>/env.sh: source it before running the programs,
# ctest or cmake --build again (PATH for capnp, LD_LIBRARY_PATH for the unpacked libraries).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  cat <<'EOF'
usage: bash scripts/gpu/build.sh [--main] [--target NAME]... [--configure-only] [--keep-going] [--] [CMAKE_ARGS...]

  --main            build only the three programs of the main job (as scripts/build.sh --main)
  --target NAME     build only NAME (repeatable)
  --configure-only  stop after cmake's configure step
  --keep-going      build every target that can be built when one fails (ninja -k 0); still fails
  CMAKE_ARGS        other arguments go to cmake's configure step (-DOOBLECK_BUILD_BENCH=OFF, ...)

Environment:
  OOBLECK_BUILD_DIR        build folder (default build-gpu)
  OOBLECK_GPU_DEPS_PREFIX  where the .deb files are unpacked (default /tmp/oobleck-gpu-deps)
  OOBLECK_PYTHON           the Python whose torch is built against (default python3)
  CUDACXX or CUDA_HOME     the CUDA toolkit's nvcc (default: nvcc on PATH, /usr/local/cuda, the wheel's)
  NCCL_LIBRARY, NCCL_INCLUDE_DIR, CUDART_LIBRARY   override what is found in the wheel's nvidia/ folder
  TORCH_CUDA_ARCH_LIST     passed to LibTorch's CMake config (default 9.0: H100, H200)
EOF
}

die() {
  echo "gpu/build: $*" >&2
  exit 1
}
say() { echo "gpu/build: $*"; }

targets=()
configure_only=false
keep_going=false
cmake_args=()
while (($# > 0)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --main) targets+=(--target oobleck-local oobleck-coordinator oobleck-worker) ;;
    --target)
      (($# >= 2)) || die "--target needs a target name"
      targets+=(--target "$2")
      shift
      ;;
    --configure-only) configure_only=true ;;
    --keep-going) keep_going=true ;;
    --) shift; cmake_args+=("$@"); break ;;
    *) cmake_args+=("$1") ;;
  esac
  shift
done

build=${OOBLECK_BUILD_DIR:-build-gpu}
prefix=${OOBLECK_GPU_DEPS_PREFIX:-/tmp/oobleck-gpu-deps}
python=${OOBLECK_PYTHON:-python3}
multiarch=x86_64-linux-gnu
started=$SECONDS

# ---- Tools of the machine ------------------------------------------------------------------------
[[ $(uname -m) == x86_64 ]] || die "this machine is $(uname -m); the .deb files in .gpu-deps are amd64 (x86-64)"
command -v "$python" >/dev/null || die "no '$python' on PATH (set OOBLECK_PYTHON to the Python that has the CUDA PyTorch)"
# pip's cmake and ninja live beside the Python that holds them.
pybin=$(dirname "$(command -v "$python")")
for tool in cmake ninja; do
  if ! command -v "$tool" >/dev/null; then
    [[ -x $pybin/$tool ]] || die "'$tool' is not on PATH nor beside $python"
    export PATH="$PATH:$pybin"
  fi
done
cxx=${CXX:-}
if [[ -z $cxx ]]; then
  for c in c++ g++; do command -v "$c" >/dev/null && { cxx=$c; break; }; done
fi
if [[ -z $cxx ]] || ! command -v "$cxx" >/dev/null; then
  die "no C++ compiler (c++, g++ or \$CXX): the GPU build compiles the project here"
fi
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [[ -n $glibc && $(printf '%s\n%s\n' 2.36 "$glibc" | sort -V | head -1) != 2.36 ]]; then
  die "glibc $glibc is older than Debian bookworm's 2.36, which the libraries in .gpu-deps were built for"
fi

# ---- Unpack the .deb files -------------------------------------------------------------------------
shopt -s nullglob
debs=(.gpu-deps/*.deb)
shopt -u nullglob
((${#debs[@]} > 0)) || die "no .deb files in .gpu-deps/: run 'bash scripts/gpu/fetch-debs.sh' on the Debian machine and name .gpu-deps in the device tool's carry"
for p in libcaf-dev libcapnp-dev capnproto libboost1.74-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev doctest-dev \
  libssl-dev pkgconf-bin; do
  compgen -G ".gpu-deps/${p}_*.deb" >/dev/null || die ".gpu-deps/ has no $p .deb: run scripts/gpu/fetch-debs.sh again"
done
[[ $prefix == /* && $prefix != / && $prefix != *..* ]] || die "OOBLECK_GPU_DEPS_PREFIX must be an absolute folder other than / (got '$prefix')"

stamp=$prefix/.oobleck-gpu-debs
want_stamp=$(stat -c '%n %s' "${debs[@]}")
if [[ -f $stamp && $(cat "$stamp") == "$want_stamp" ]]; then
  say "the .deb files are already unpacked in $prefix"
else
  if [[ -e $prefix && ! -f $stamp && -n $(ls -A "$prefix") ]]; then
    die "$prefix exists, is not empty and was not made by this script: remove it or set OOBLECK_GPU_DEPS_PREFIX"
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  say "unpacking ${#debs[@]} .deb files into $prefix"
  dpkg_deb=$(command -v dpkg-deb || true)
  for deb in "${debs[@]}"; do
    if [[ -n $dpkg_deb && -x $dpkg_deb ]]; then
      dpkg-deb -x "$deb" "$prefix"
    else
      # Without dpkg: a .deb is an ar archive whose data.tar.* holds the files.
      command -v ar >/dev/null || die "neither dpkg-deb nor ar is here to unpack $deb"
      member=$(ar t "$deb" | grep '^data\.tar') || die "$deb has no data.tar member"
      case $member in
        *.xz) z=-J ;;
        *.zst) z=--zstd ;;
        *.gz) z=-z ;;
        *) z="" ;;
      esac
      ar p "$deb" "$member" | tar -x ${z:+"$z"} -f - -C "$prefix" || die "could not unpack $deb with ar and tar"
    fi
  done
  usr=$prefix/usr
  # Debian's CMake and pkg-config files that name /usr outright (the other CMake files find
  # themselves relative to their folder). Cap'n Proto's CMake config makes its targets from
  # pkg-config's answers, so its .pc files must name the prefix.
  sed -i "s|set(_IMPORT_PREFIX \"/usr\")|set(_IMPORT_PREFIX \"$usr\")|" "$usr/lib/cmake/doctest/doctestTargets.cmake"
  sed -i -e "s|/usr/bin/capnp|$prefix/wrappers/capnp|" -e "s|CAPNP_INCLUDE_DIRECTORY /usr/include|CAPNP_INCLUDE_DIRECTORY $usr/include|" \
    "$usr/lib/$multiarch/cmake/CapnProto/CapnProtoConfig.cmake"
  sed -i "s|^prefix=/usr\$|prefix=$usr|" "$usr/lib/$multiarch/pkgconfig/"*.pc "$usr/share/pkgconfig/"*.pc
  # The tools the build runs from the prefix find its libraries themselves, so that a later
  # 'cmake --build' needs no env.sh; this pkg-config reads the prefix's .pc files and no others.
  mkdir -p "$prefix/wrappers"
  for tool in capnp capnpc-c++ pkg-config; do
    real=$usr/bin/$tool
    [[ $tool == pkg-config ]] && real=$usr/bin/pkgconf
    {
      echo '#!/bin/sh'
      # shellcheck disable=SC2016 # expands when the wrapper runs
      printf 'LD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\nexport LD_LIBRARY_PATH\n' "$usr/lib/$multiarch"
      if [[ $tool == pkg-config ]]; then
        printf 'PKG_CONFIG_LIBDIR=%q\nexport PKG_CONFIG_LIBDIR\n' "$usr/lib/$multiarch/pkgconfig:$usr/share/pkgconfig"
      fi
      printf 'exec %q "$@"\n' "$real"
    } >"$prefix/wrappers/$tool"
    chmod +x "$prefix/wrappers/$tool"
  done
  # One OpenSSL per process: where the machine has its own libssl.so.3 (OpenSSL 3.x keeps the 3.0
  # ABI), link and run against it, so that LD_LIBRARY_PATH does not put bookworm's before it.
  sys_ssl=$( (ldconfig -p 2>/dev/null || true) | awk '$1 == "libssl.so.3" && /x86-64/ {print $NF; exit}')
  sys_crypto=$( (ldconfig -p 2>/dev/null || true) | awk '$1 == "libcrypto.so.3" && /x86-64/ {print $NF; exit}')
  if [[ -n $sys_ssl && -n $sys_crypto ]]; then
    ln -sfn "$sys_ssl" "$usr/lib/$multiarch/libssl.so.3"
    ln -sfn "$sys_crypto" "$usr/lib/$multiarch/libcrypto.so.3"
    rm -rf "$usr/lib/$multiarch/engines-3" "$usr/lib/$multiarch/ossl-modules"
  fi
  echo "$want_stamp" >"$stamp"
fi
usr=$prefix/usr
libdir=$usr/lib/$multiarch
# Cap'n Proto 0.9.2's blob.h compares 'const char* == kj::StringPtr', which GCC 13 in C++20 finds
# no operator for (bookworm's GCC 12 does; Cap'n Proto 0.10 changed these lines): compare from the
# StringPtr side, as those lines mean. Idempotent, so a prefix unpacked before this fix gets it too.
sed -i -e 's|{ return a == b.asString(); }|{ return kj::StringPtr(a) == b.asString(); }|' \
  -e 's|{ return a != b.asString(); }|{ return !(kj::StringPtr(a) == b.asString()); }|' "$usr/include/capnp/blob.h"
[[ -x $usr/bin/capnp && -x $usr/bin/pkgconf && -x $prefix/wrappers/pkg-config && -f $libdir/libcaf_core.so &&
  -f $usr/include/boost/asio.hpp ]] ||
  die "$prefix lacks capnp, pkgconf, libcaf_core.so or boost/asio.hpp after unpacking: remove it and run again"
"$prefix/wrappers/pkg-config" --exists capnp kj ||
  die "the prefix's pkg-config ($prefix/wrappers/pkg-config) does not find capnp.pc and kj.pc"
"$prefix/wrappers/capnp" --version >/dev/null || die "the unpacked capnp ($usr/bin/capnp) does not run here"

# ---- PyTorch, its cudart and NCCL -----------------------------------------------------------------
info=$("$python" - <<'EOF' 2>&1
import os, sys
try:
    import torch
except Exception as e:  # noqa: BLE001
    print(f"error=cannot import torch: {e!r}")
    sys.exit(3)
print("version=" + torch.__version__)
print("cuda=" + (torch.version.cuda or ""))
print("abi=" + str(int(bool(torch.compiled_with_cxx11_abi()))))
print("prefix=" + torch.utils.cmake_prefix_path)
print("torchdir=" + os.path.dirname(torch.__file__))
print("python=" + sys.executable)
dirs = []
try:
    import nvidia
    dirs = [str(d) for d in nvidia.__path__]
except Exception:  # noqa: BLE001
    pass
dirs.append(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia"))
print("nvidia=" + os.pathsep.join(dict.fromkeys(dirs)))
EOF
) || die "$python cannot import torch; this build uses the LibTorch of a CUDA PyTorch wheel (torch.utils.cmake_prefix_path):
  $(grep '^error=' <<<"$info" | cut -d= -f2- || echo "$info" | tail -3)
  Run it where '$python' (or OOBLECK_PYTHON) is the Python that holds the CUDA PyTorch."
field() { grep "^$1=" <<<"$info" | head -1 | cut -d= -f2-; }
torch_version=$(field version)
torch_cuda=$(field cuda)
torch_abi=$(field abi)
torch_prefix=$(field prefix)
torch_dir=$(field torchdir)
python_exe=$(field python)
IFS=: read -r -a nvidia_dirs <<<"$(field nvidia)"

[[ -n $torch_cuda ]] || die "torch $torch_version from $torch_dir is a CPU build (torch.version.cuda is None): the GPU build needs a CUDA wheel"
if [[ $torch_abi != 1 ]]; then
  die "torch $torch_version reports torch.compiled_with_cxx11_abi() == False: its LibTorch uses the old
  std::string/std::list ABI (-D_GLIBCXX_USE_CXX11_ABI=0), but the Debian libraries in .gpu-deps (CAF,
  toml++, Cap'n Proto) use the C++11 ABI, so the programs could not link both. Use a wheel built with
  the C++11 ABI (PyTorch's manylinux_2_28 wheels are)."
fi
[[ -f $torch_prefix/Torch/TorchConfig.cmake ]] || die "no Torch/TorchConfig.cmake under torch.utils.cmake_prefix_path ($torch_prefix)"
cuda_major=${torch_cuda%%.*}

# The first file that matches, in the wheel's nvidia/ folders (cu13 layout: nvidia/cu13/lib; cu12: nvidia/cuda_runtime/lib).
find_in_nvidia() {
  local d pattern f
  for pattern in "$@"; do
    for d in "${nvidia_dirs[@]}"; do
      [[ -d $d ]] || continue
      for f in "$d"/$pattern; do
        [[ -e $f ]] && { echo "$f"; return 0; }
      done
    done
  done
  return 1
}
cudart=${CUDART_LIBRARY:-$(find_in_nvidia "cu$cuda_major/lib/libcudart.so.$cuda_major" "*/lib/libcudart.so.$cuda_major" "*/lib/libcudart.so*" || true)}
[[ -n $cudart && -f $cudart ]] || die "no libcudart.so.$cuda_major of the wheel under ${nvidia_dirs[*]} (is nvidia-cuda-runtime installed?); set CUDART_LIBRARY"
nccl_lib=${NCCL_LIBRARY:-$(find_in_nvidia "nccl/lib/libnccl.so.2" "nccl/lib/libnccl.so*" "*/lib/libnccl.so.2" || true)}
[[ -n $nccl_lib && -f $nccl_lib ]] || die "no libnccl.so.2 of the wheel under ${nvidia_dirs[*]} (is nvidia-nccl-cu$cuda_major installed?); set NCCL_LIBRARY"
nccl_inc=${NCCL_INCLUDE_DIR:-}
if [[ -z $nccl_inc ]]; then
  nccl_h=$(find_in_nvidia "nccl/include/nccl.h" "*/include/nccl.h" || true)
  [[ -n $nccl_h ]] && nccl_inc=$(dirname "$nccl_h")
fi
[[ -n $nccl_inc && -f $nccl_inc/nccl.h ]] || die "no nccl.h beside the wheel's NCCL ($nccl_lib); set NCCL_INCLUDE_DIR"
nccl_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) / {v = v (v ? "." : "") $3} END {print v}' "$nccl_inc/nccl.h")

# The toolkit: its headers and nvcc (LibTorch's CMake config enables the CUDA language).
nvcc=""
for c in "${CUDACXX:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
  [[ -n $c && -x $c ]] && { nvcc=$c; break; }
done
[[ -n $nvcc ]] || nvcc=$(find_in_nvidia "cu$cuda_major/bin/nvcc" "cuda_nvcc/bin/nvcc" || true)
[[ -n $nvcc ]] || die "no nvcc (CUDACXX, CUDA_HOME/bin, PATH, /usr/local/cuda/bin, the wheel's nvidia/): LibTorch's CMake config needs the CUDA toolkit"
nvcc=$(readlink -f "$nvcc")
cuda_root=$(dirname "$(dirname "$nvcc")")
nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[[ ${nvcc_version%%.*} == "$cuda_major" ]] ||
  say "warning: nvcc is CUDA $nvcc_version, torch was built with CUDA $torch_cuda (the headers come from nvcc's toolkit)"

cudnn_args=()
cudnn_h=$(find_in_nvidia "cudnn/include/cudnn.h" "cu$cuda_major/include/cudnn.h" || true)
cudnn_so=$(find_in_nvidia "cudnn/lib/libcudnn.so.*" "cu$cuda_major/lib/libcudnn.so.*" || true)
if [[ -n $cudnn_h && -n $cudnn_so ]]; then
  cudnn_args=(-DCUDNN_INCLUDE_PATH="$(dirname "$cudnn_h")" -DCUDNN_LIBRARY_PATH="$cudnn_so")
fi

export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
say "torch $torch_version ($torch_dir), built with CUDA $torch_cuda, C++11 ABI: yes"
say "CMake prefix of torch: $torch_prefix"
say "nvcc: $nvcc (CUDA $nvcc_version); toolkit $cuda_root"
say "cudart (the wheel's): $cudart"
say "NCCL $nccl_version (the wheel's): $nccl_lib, headers $nccl_inc"
say "cuDNN: ${cudnn_so:-not found (the LibTorch config then only warns)}"
say "C++ compiler: $("$cxx" --version | head -1); cmake $(cmake --version | awk 'NR == 1 {print $3}'); glibc ${glibc:-?}"
say "Debian packages: $prefix ($(awk -F'[_ ]' '{print $1}' "$stamp" | sed 's|.*/||' | paste -sd' '))"
if [[ ! -f $torch_dir/include/gloo/algorithm.h && ! -f $usr/include/gloo/algorithm.h ]]; then
  say "warning: no gloo headers in $torch_dir/include: bench/transport_vs_gloo will not compile (--keep-going, or -DOOBLECK_BUILD_BENCH=OFF)"
fi

# ---- env.sh ---------------------------------------------------------------------------------------
mkdir -p "$build"
path_dirs="$usr/bin:$(dirname "$nvcc")"
lib_dirs="$libdir:$(dirname "$cudart"):$(dirname "$nccl_lib"):$torch_dir/lib"
{
  echo "# Written by scripts/gpu/build.sh: source it before running what $build holds, ctest or cmake --build."
  printf 'export OOBLECK_GPU_DEPS_PREFIX=%q\n' "$prefix"
  # shellcheck disable=SC2016 # the variables expand where env.sh is sourced
  printf 'export PATH=%q"${PATH:+:$PATH}"\n' "$path_dirs"
  # shellcheck disable=SC2016
  printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$lib_dirs"
  printf 'export TORCH_CUDA_ARCH_LIST=%q\n' "$TORCH_CUDA_ARCH_LIST"
} >"$build/env.sh"
# shellcheck source=/dev/null
source "$build/env.sh"

# ---- Configure and build --------------------------------------------------------------------------
# The compiler searches /usr/include/<multiarch> by itself, not the prefix's (OpenSSL's opensslconf.h
# is there): every compilation gets it as a standard include folder.
prefix_path="$torch_prefix;$usr;$libdir/cmake;$usr/lib/cmake;$usr/share/cmake"
# File by file, not in unity batches: the GPU machine has the cores for it, and the CUDA-only files
# (nccl_communicator, cuda_support, the CUDA tests) have never been compiled batched with the others.
# glibc's malloc (OOBLECK_ALLOCATOR=system): the .debs carried to the GPU machine do not include
# tcmalloc, and a GPU step's host allocations are few.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOOBLECK_WITH_CUDA=ON \
  -DOOBLECK_UNITY_BUILD=OFF -DOOBLECK_UNITY_TESTS=OFF -DOOBLECK_ALLOCATOR=system \
  -DCMAKE_CXX_COMPILER="$(command -v "$cxx")" \
  -DCMAKE_PREFIX_PATH="$prefix_path" \
  -DCMAKE_INCLUDE_PATH="$usr/include" -DCMAKE_LIBRARY_PATH="$libdir" \
  -DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES="$usr/include/$multiarch" \
  -DCMAKE_C_STANDARD_INCLUDE_DIRECTORIES="$usr/include/$multiarch" \
  -DCMAKE_BUILD_RPATH="$libdir;$(dirname "$cudart");$(dirname "$nccl_lib")" \
  -DCAPNP_EXECUTABLE="$prefix/wrappers/capnp" -DCAPNPC_CXX_EXECUTABLE="$prefix/wrappers/capnpc-c++" \
  -DPKG_CONFIG_EXECUTABLE="$prefix/wrappers/pkg-config" \
  -DCAPNPC_IMPORT_DIRS="$usr/include" \
  -DOPENSSL_ROOT_DIR="$usr" -DBoost_DIR="$libdir/cmake/Boost-1.74.0" -DBoost_NO_SYSTEM_PATHS=ON \
  -DPython_EXECUTABLE="$python_exe" -DPYTHON_EXECUTABLE="$python_exe" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" \
  -DCUDA_cudart_LIBRARY="$cudart" -DCUDA_CUDART_LIBRARY="$cudart" \
  -DNCCL_INCLUDE_DIR="$nccl_inc" -DNCCL_LIBRARY="$nccl_lib" \
  "${cudnn_args[@]}" \
  "${cmake_args[@]}"

# The configure step must have taken what this script found, not some other copy on the machine.
cache=$build/CMakeCache.txt
for v in CAF_INCLUDE_DIR:"$usr/include" CAF_core_LIBRARY:"$libdir/" NCCL_LIBRARY:"$nccl_lib" NCCL_INCLUDE_DIR:"$nccl_inc" \
  CUDA_cudart_LIBRARY:"$cudart" CapnProto_DIR:"$libdir/cmake/CapnProto" CapnProto_capnp_IMPORTED_LOCATION:"$libdir/" \
  CapnProto_kj_IMPORTED_LOCATION:"$libdir/" OPENSSL_INCLUDE_DIR:"$usr/include" Boost_INCLUDE_DIR:"$usr/include" \
  doctest_DIR:"$usr/" tomlplusplus_DIR:"$usr/" CLI11_DIR:"$usr/" nlohmann_json_DIR:"$usr/"; do
  name=${v%%:*}
  want=${v#*:}
  got=$(sed -n "s/^$name:[A-Z]*=//p" "$cache")
  [[ $got == "$want"* ]] || die "configure took $name=$got, expected $want..."
done
say "configured $build in $((SECONDS - started)) s"
$configure_only && exit 0

ninja_args=()
$keep_going && ninja_args=(-- -k 0)
if ! cmake --build "$build" -j"$(nproc)" "${targets[@]}" "${ninja_args[@]}"; then
  die "the build failed after $((SECONDS - started)) s (see the errors above)"
fi
say "built $build in $((SECONDS - started)) s; next: bash scripts/gpu/test.sh (or: source $build/env.sh)"
