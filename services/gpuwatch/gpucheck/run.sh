#!/usr/bin/env bash
# gpucheck: runs gpuwatch for ~20 s on this machine's GPUs, idle then under a PyTorch
# matmul, and checks what it publishes. Run from anywhere; exits non-zero on a failed check.
#   gpucheck/run.sh                 build (when go is here) and check
#   GPUCHECK_BIN=dir gpucheck/run.sh   use gpuwatch and gpucheck prebuilt in dir (build.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${GPUCHECK_BIN:-$here/bin}
if command -v go >/dev/null 2>&1 && [ -z "${GPUCHECK_BIN:-}" ]; then
	"$here/build.sh" "$bin"
fi
for b in gpuwatch gpucheck; do
	[ -x "$bin/$b" ] || { echo "gpucheck: $bin/$b missing: run gpucheck/build.sh where Go is installed" >&2; exit 2; }
done
echo "== nvidia-smi"
nvidia-smi --query-gpu=index,name,driver_version,utilization.gpu,power.draw,power.limit,temperature.gpu --format=csv || true
cd "$here"
exec "$bin/gpucheck" -gpuwatch "$bin/gpuwatch" -load "python3 $here/matmul.py" "$@"
