#!/usr/bin/env bash
# Builds gpuwatch and gpucheck into the directory given (default gpucheck/bin).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/bin}
mkdir -p "$out"
cd "$here/.."
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations} GOWORK=off
go build -o "$out/gpuwatch" .
go build -o "$out/gpucheck" ./gpucheck
echo "gpucheck: built $out/gpuwatch and $out/gpucheck"
