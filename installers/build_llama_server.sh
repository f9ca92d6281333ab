#!/usr/bin/env bash
# Build llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist, so the
# peer benchmark measures the same llama.cpp revision tandem runs on.
#
#   installers/build_llama_server.sh            # prints the binary's path on the last line
#   LLAMA_SERVER=$(installers/build_llama_server.sh | tail -n1)
#
# Portable CPU flags (no -march=native): AVX2/FMA/F16C always, AVX-512 (F, VNNI, BF16) only
# when /proc/cpuinfo lists them. Cached under ${XDG_CACHE_HOME:-~/.cache}/tandem/llama-server/
# keyed by version and flags; a second run finds the binary and builds nothing.
#
# Environment:
#   TANDEM_LLAMA_SDIST       use this llama_cpp_python-*.tar.gz instead of `pip download`
#   TANDEM_LLAMA_CMAKE_ARGS  extra cmake arguments (appended; part of the cache key)
#   JOBS                     parallel compile jobs (default: nproc)
#   PYTHON                   interpreter whose pip downloads the sdist (default: python3)
set -euo pipefail

VERSION="0.3.36"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-server"

log() { echo "build_llama_server: $*" >&2; }
die() { log "error: $*"; exit 1; }

command -v cmake >/dev/null || die "cmake not found (apt-get install cmake)"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
  || die "no C++ compiler found (apt-get install build-essential)"

# --- flags ------------------------------------------------------------------------------------
flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
)
case "$(uname -m)" in
  x86_64|amd64)
    flags+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
    cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    if [[ "$cpu_flags" == *" avx512f "* ]]; then
      flags+=(-DGGML_AVX512=ON)
      [[ "$cpu_flags" == *" avx512_vnni "* ]] && flags+=(-DGGML_AVX512_VNNI=ON)
      [[ "$cpu_flags" == *" avx512_bf16 "* ]] && flags+=(-DGGML_AVX512_BF16=ON)
    fi
    ;;
esac
if [[ -n "${TANDEM_LLAMA_CMAKE_ARGS:-}" ]]; then
  read -r -a extra <<<"$TANDEM_LLAMA_CMAKE_ARGS"
  flags+=("${extra[@]}")
fi

key="$(printf '%s\n' "$VERSION" "${flags[@]}" | sha256sum | cut -c1-12)"
prefix="$CACHE_ROOT/$VERSION-$key"
binary="$prefix/bin/llama-server"

cached() { [[ -x "$binary" ]] && "$binary" --version >/dev/null 2>&1; }
if cached; then
  log "cached: $binary"
  echo "$binary"
  exit 0
fi

# One build at a time: a second invocation waits for the first, then finds its binary.
mkdir -p "$CACHE_ROOT"
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/.lock"
  flock 9
  if cached; then
    log "cached: $binary (built by a concurrent run)"
    echo "$binary"
    exit 0
  fi
fi

# --- sources ----------------------------------------------------------------------------------
mkdir -p "$CACHE_ROOT/src"
sdist="${TANDEM_LLAMA_SDIST:-}"
if [[ -z "$sdist" ]]; then
  sdist="$(ls "$CACHE_ROOT"/src/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
fi
if [[ -z "$sdist" ]]; then
  log "downloading the llama-cpp-python $VERSION sdist"
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$CACHE_ROOT/src" >&2 \
    || die "pip download failed; set TANDEM_LLAMA_SDIST to a local llama_cpp_python-$VERSION.tar.gz"
  sdist="$CACHE_ROOT/src/llama_cpp_python-$VERSION.tar.gz"
fi
[[ -f "$sdist" ]] || die "sdist not found: $sdist"

work="$(mktemp -d "$CACHE_ROOT/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "extracting $(basename "$sdist")"
tar -xzf "$sdist" -C "$work"
src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
[[ -f "$src/CMakeLists.txt" ]] || die "no vendored llama.cpp in $sdist"

# --- build ------------------------------------------------------------------------------------
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
log "configuring: ${flags[*]}"
cmake -S "$src" -B "$work/build" "${generator[@]}" "${flags[@]}" >&2
log "building llama-server with $JOBS jobs (several minutes on 2 cores)"
cmake --build "$work/build" --target llama-server -j "$JOBS" >&2

built="$(find "$work/build" -type f -name llama-server -perm -u+x | head -n1)"
[[ -n "$built" ]] || die "the build produced no llama-server binary"
mkdir -p "$prefix/bin"
install -m 0755 "$built" "$binary.tmp"
mv -f "$binary.tmp" "$binary"
printf '%s\n' "${flags[@]}" >"$prefix/cmake-flags.txt"
"$binary" --version >&2 || die "the built llama-server does not run"
log "built: $binary"
echo "$binary"
