#!/usr/bin/env bash
# GPU check for the GPU tier (strata-gds), under five minutes on one NVIDIA GPU.
#
# Correctness of every transfer direction against the host's bytes, then throughput of
# disk->GPU, host->GPU and GPU-tier hits, each next to its ceiling measured in the same
# run (raw O_DIRECT reads, one cuMemcpyHtoD from pinned memory, one device-to-device
# copy). Output: JSON lines plus a one-line summary; exit 0 = all checks passed,
# 1 = a check failed, 2 = no usable GPU, 3 = missing prerequisites.
#
# Run from the repository root:
#   gds/scripts/device-check.sh [--size-mib 1024] [--dir /path/on/nvme]
#
# Needs: an NVIDIA driver (libcuda.so.1); optional libcufile.so (GPUDirect Storage,
# else the compat path is measured). And either
#   - a Rust toolchain (cargo >= 1.85): the script builds
#       cargo build --release -p strata-gds --features cuda --example device_check
#   - or a prebuilt binary (preferred when present), built elsewhere with that command
#     and stripped to target/gds-device-check/device_check (1.6 MB; it loads CUDA at
#     run time, so it builds on a machine without a GPU), or STRATA_DEVICE_CHECK_BIN.
set -euo pipefail
cd "$(dirname "$0")/../.."

echo "== strata-gds device check =="
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true
else
  echo "note: nvidia-smi not found"
fi
if ! (ldconfig -p 2>/dev/null | grep -q 'libcuda\.so') && ! ls /usr/lib*/libcuda.so* /usr/lib/*/libcuda.so* >/dev/null 2>&1; then
  echo "note: libcuda.so not found by ldconfig; the check will report 'no usable GPU' if it is really absent"
fi
if ldconfig -p 2>/dev/null | grep -q 'libcufile\.so'; then
  echo "libcufile: present (GPUDirect Storage path will be tried)"
else
  echo "libcufile: absent (compat path: O_DIRECT -> pinned -> GPU)"
fi

BIN="${STRATA_DEVICE_CHECK_BIN:-}"
PREBUILT=target/gds-device-check/device_check
if [ -z "$BIN" ] && [ -x "$PREBUILT" ] && [ "${STRATA_DEVICE_CHECK_BUILD:-0}" != 1 ]; then
  BIN="$PREBUILT"
  echo "using the prebuilt $BIN (built $(date -r "$BIN" -u +%FT%TZ)); STRATA_DEVICE_CHECK_BUILD=1 rebuilds"
fi
if [ -z "$BIN" ]; then
  if command -v cargo >/dev/null 2>&1; then
    echo "building: cargo build --release -p strata-gds --features cuda --example device_check"
    cargo build --release -p strata-gds --features cuda --example device_check
    BIN=target/release/examples/device_check
  elif [ -x target/release/examples/device_check ]; then
    BIN=target/release/examples/device_check
    echo "cargo not found; using the prebuilt $BIN"
  else
    cat >&2 <<'MSG'
device-check: cannot run: no cargo and no prebuilt binary.
  Either install Rust (https://rustup.rs, toolchain >= 1.85; building also needs
  Debian's librocksdb-dev for strata-cache-core) and rerun, or build on any Linux x86_64
  machine (no GPU needed; the binary loads CUDA at run time and needs glibc >= 2.34):
    cargo build --release -p strata-gds --features cuda --example device_check
    strip -o target/gds-device-check/device_check target/release/examples/device_check
  and copy target/gds-device-check/device_check here (same path), or set
  STRATA_DEVICE_CHECK_BIN=/path/to/device_check.
MSG
    exit 3
  fi
fi

# Default file location: the current directory's disk (not /tmp, which may be tmpfs).
args=("$@")
if ! printf '%s\n' "${args[@]:-}" | grep -q -- '--dir'; then
  args+=(--dir "$PWD")
fi
echo "running: $BIN ${args[*]}"
timeout 270 "$BIN" "${args[@]}"
