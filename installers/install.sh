#!/usr/bin/env bash
# Install tandem into ./.venv: choose the llama.cpp build for this machine, build its wheel
# once into a cache outside the repo, install the project, fetch the embedded model.
# Usage: bash installers/install.sh [--dev] [--client] [--exact]
#   --dev adds the test tools (and --exact, which its tests use); --client the OpenAI,
#   Anthropic and Ollama Python clients that the README's examples use; --exact a second
#   llama.cpp build, without tinyBLAS, for `tandem ... --exact` (CPU builds only)
# Safe to re-run: with nothing to do it finishes in seconds.
set -euo pipefail

LLAMA_CPP_VERSION=0.3.36
DEFAULT_MODEL=smollm2-135m-instruct
# Linux has no Metal, but MLX's CPU backend lets the MLX runner's tests run in CI.
LINUX_DEV_PINS=("mlx[cpu]==0.32.4" "mlx-lm==0.32.2")

say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }

dev=0
client=0
exact=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --client) client=1 ;;
    --exact) exact=1 ;;
    -h | --help) sed -n '2,8p' "$0" | sed 's/^# //'; exit 0 ;;
    *) die "unknown option '$arg' (usage: bash installers/install.sh [--dev] [--client] [--exact])" ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

sha256_of_stdin() {
  "$PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

# --- Python and the venv ------------------------------------------------------------------
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found; install Python 3.11 or newer"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  die "Python 3.11 or newer is needed; '$PYTHON' is $("$PYTHON" -V 2>&1) (set PYTHON=/path/to/python3.11)"
venv_python=.venv/bin/python
if [[ ! -x $venv_python ]]; then
  say "python: creating .venv with $("$PYTHON" -V 2>&1)"
  "$PYTHON" -m venv .venv || die "'$PYTHON -m venv' failed (Debian/Ubuntu: apt-get install python3-venv)"
else
  "$venv_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die ".venv runs $("$venv_python" -V 2>&1), older than 3.11; remove .venv and re-run"
  say "python: reusing .venv ($("$venv_python" -V 2>&1))"
fi

# --- which llama.cpp build ----------------------------------------------------------------
os=$(uname -s)
arch=$(uname -m)
extras=""
if [[ $os == Darwin && $arch == arm64 ]]; then
  cmake_args="-DGGML_METAL=on"
  extras="mlx"
  say "backend: Metal llama.cpp build plus the mlx extra (Apple Silicon)"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  cmake_args="-DGGML_CUDA=on"
  say "backend: CUDA llama.cpp build (nvidia-smi lists a GPU)"
else
  # Never GGML_NATIVE: -march=native enables AMX on CPUs that advertise it while the kernel
  # refuses it to the process, and the build then dies with "Illegal instruction".
  cmake_args="-DGGML_NATIVE=OFF"
  if [[ $arch == x86_64 || $arch == amd64 ]]; then
    cpu_flags=""
    if [[ -r /proc/cpuinfo ]]; then cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "; fi
    # Without /proc/cpuinfo (Intel macOS) assume the AVX2 generation; AVX-512 needs proof.
    has() { [[ -z $cpu_flags || $cpu_flags == *" $1 "* ]]; }
    has_proven() { [[ $cpu_flags == *" $1 "* ]]; }
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C; do
      if has "${pair%%:*}"; then cmake_args+=" -DGGML_${pair#*:}=ON"; fi
    done
    if has_proven avx512f; then
      cmake_args+=" -DGGML_AVX512=ON"
      if has_proven avx512_vnni; then cmake_args+=" -DGGML_AVX512_VNNI=ON"; fi
      if has_proven avx512_bf16; then cmake_args+=" -DGGML_AVX512_BF16=ON"; fi
    fi
  fi
  say "backend: portable CPU llama.cpp build ($cmake_args): no Apple GPU, no nvidia-smi; not native, which can SIGILL on AMX CPUs"
fi
if [[ $client == 1 ]]; then
  extras=${extras:+$extras,}client
  say "extras: client (the openai, anthropic and ollama Python clients)"
fi
base_extras=$extras
if [[ $dev == 1 ]]; then
  extras=${extras:+$extras,}dev
  say "extras: dev (test tools)$([[ $os == Linux ]] && echo "; plus ${LINUX_DEV_PINS[*]} for MLX tests on CPU")"
fi
use_dev_pins=0
if [[ $dev == 1 && $os == Linux ]]; then use_dev_pins=1; fi

# The llama-cpp-python wheel built with CMAKE_ARGS $1, from the cache or built once into it;
# sets $wheel to its path.
cached_wheel() {
  local args_hash cache_root wheel_dir jobs wheels # build_dir global: the EXIT trap reads it
  args_hash=$(printf '%s' "$1" | sha256_of_stdin | cut -c1-12)
  cache_root=${TANDEM_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/wheels}
  wheel_dir=$cache_root/llama-cpp-python-$LLAMA_CPP_VERSION-$args_hash
  shopt -s nullglob
  wheels=("$wheel_dir"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl)
  shopt -u nullglob # on only here: elsewhere it would silently drop words like mlx[cpu]
  if [[ ${#wheels[@]} -eq 0 ]]; then
    jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
    say "llama-cpp-python: no cached wheel for $1; building it once into $wheel_dir (minutes)"
    mkdir -p "$cache_root"
    build_dir=$(mktemp -d "$cache_root/.build-XXXXXX")
    trap 'rm -rf "$build_dir"' EXIT
    # --no-binary: always compile with our flags, never take a prebuilt wheel from an index;
    # --no-cache-dir: pip's wheel cache would hand back a build made with other flags.
    CMAKE_ARGS="$1" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
      "$venv_python" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
      --wheel-dir "$build_dir" "llama-cpp-python==$LLAMA_CPP_VERSION"
    mkdir -p "$wheel_dir"
    mv "$build_dir"/llama_cpp_python-*.whl "$wheel_dir"/
    rm -rf "$build_dir" # now: a second build in this run would leave it behind
    wheels=("$wheel_dir"/llama_cpp_python-*.whl)
  else
    say "llama-cpp-python: using the cached wheel ${wheels[0]}"
  fi
  wheel=${wheels[0]}
}

# --- packages (skipped when the stamp says nothing changed) -------------------------------
# The stamp hashes everything that decides the pip work, the script included (a changed
# install step must run again).
stamp_for() { # $1: 1 for a --dev install
  local ex=$base_extras pins=""
  if [[ $1 == 1 ]]; then
    ex=${ex:+$ex,}dev
    if [[ $os == Linux ]]; then pins="${LINUX_DEV_PINS[*]}"; fi
  fi
  (cat pyproject.toml installers/install.sh; printf '\n%s\n%s\n%s\n' "$cmake_args" "$ex" "$pins") | sha256_of_stdin
}
stamp_file=.venv/.tandem-install-stamp
stamp=$(stamp_for "$dev")
recorded=$(cat "$stamp_file" 2>/dev/null || true)
# A --dev install holds everything a plain one needs, so it satisfies both.
if [[ -x .venv/bin/tandem && -n $recorded && ($recorded == "$stamp" || $recorded == "$(stamp_for 1)") ]]; then
  say "packages: up to date (pyproject.toml, installer, build flags and extras unchanged)"
else
  cached_wheel "$cmake_args"
  say "packages: installing the llama-cpp-python wheel and tandem${extras:+ [$extras]}"
  # --force-reinstall: the version is the same whatever the flags, so pip would keep an
  # older build made with different ones.
  "$venv_python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
  if [[ $use_dev_pins == 1 ]]; then
    "$venv_python" -m pip install --quiet -e ".${extras:+[$extras]}" "${LINUX_DEV_PINS[@]}"
  else
    "$venv_python" -m pip install --quiet -e ".${extras:+[$extras]}"
  fi
  printf '%s\n' "$stamp" >"$stamp_file"
fi

# --- the exact-mode library (backends/llamacpp/exact.py) -------------------------------------
# The same llama.cpp without llamafile's tinyBLAS, whose matmuls sum in another order for 2+
# columns than ggml's vec_dot for 1; only its shared libraries, loaded instead of the
# default ones by `tandem ... --exact`.
if [[ $dev == 1 || $exact == 1 ]]; then
  exact_dir=.venv/lib/tandem-llama-exact
  exact_args="$cmake_args -DGGML_LLAMAFILE=OFF"
  exact_stamp="llama-cpp-python $LLAMA_CPP_VERSION: $exact_args" # the bindings' version too
  if [[ $cmake_args == *GGML_METAL* || $cmake_args == *GGML_CUDA* ]]; then
    why="exact mode is built and measured for the CPU llama.cpp build only"
    if [[ $exact == 1 ]]; then die "--exact: $why; this machine's build is $cmake_args"; fi
    say "exact: skipped ($why)"
  elif [[ -f $exact_dir/libllama.so || -f $exact_dir/libllama.dylib ]] &&
    [[ $(cat "$exact_dir/.stamp" 2>/dev/null) == "$exact_stamp" ]]; then
    say "exact: up to date ($exact_dir)"
  else
    cached_wheel "$exact_args"
    say "exact: unpacking its llama.cpp libraries into $exact_dir"
    rm -rf "$exact_dir"
    "$venv_python" - "$wheel" "$exact_dir" <<'PY'
import pathlib, sys, zipfile
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
dest.mkdir(parents=True)
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if name.startswith("llama_cpp/lib/") and not name.endswith("/"):
            (dest / pathlib.PurePosixPath(name).name).write_bytes(zf.read(name))
PY
    printf '%s\n' "$exact_stamp" >"$exact_dir/.stamp"
  fi
fi

# --- the embedded model (instant when its verified sidecar is present) --------------------
say "model: $DEFAULT_MODEL (the embedded default)"
.venv/bin/tandem models pull "$DEFAULT_MODEL" >/dev/null
say "done: .venv/bin/tandem run \"Why is the sky blue?\""
