#!/usr/bin/env bash
# tokenscope's one-command local stack, for a fresh Debian machine without Docker: installs
# what is missing (clickhouse-server, and gcc for gpuwatch's cgo) with apt, checks Go, builds
# the tokenscope command and runs `tokenscope demo` (extra arguments are passed to it).
# Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v clickhouse-server >/dev/null || [ -x /usr/sbin/clickhouse-server ] || command -v clickhouse >/dev/null || need+=(clickhouse-server)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if ((${#need[@]})); then
	echo "installing ${need[*]} (apt)…"
	if [ "$(id -u)" = 0 ]; then
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
	elif command -v sudo >/dev/null; then
		sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
	else
		echo "missing ${need[*]}: as root, run: apt-get install -y ${need[*]}" >&2
		exit 1
	fi
fi

command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null; then
	echo "Go is not installed: get Go 1.26 or later from https://go.dev/dl/ (tar -C /usr/local -xzf go1.26.*.linux-amd64.tar.gz)" >&2
	exit 1
fi
ver=$(go env GOVERSION | sed 's/^go//')
major=${ver%%.*}; rest=${ver#*.}; minor=${rest%%[.a-z]*}
if ((major < 1 || (major == 1 && minor < 26))); then
	echo "Go $ver is too old: tokenscope needs Go 1.26 or later (https://go.dev/dl/)" >&2
	exit 1
fi

mkdir -p bin
(cd cli && go build -o ../bin/tokenscope ./cmd/tokenscope)
exec bin/tokenscope demo "$@"
