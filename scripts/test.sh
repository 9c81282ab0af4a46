#!/usr/bin/env bash
# tokenscope's test command, for a fresh Debian 12 machine (as root, or with sudo): installs
# what the tests need and is missing, then runs `make test` (extra arguments go to make).
#   apt:  clickhouse-server, clickhouse-client, gcc, libc6-dev, make, curl, ca-certificates;
#         nodejs and npm only when there is no Node.js 18 or newer (a Node installed another
#         way, NodeSource's say, stays: Debian's npm conflicts with it)
#   npm:  the Node projects the tests drive (official SDKs, the OpenTelemetry JS exporter, nats.js, the Claude Code CLI),
#         into their git-ignored node_modules
#   Go 1.26 or later must be installed already (https://go.dev/dl/).
# With CI=true a test whose server, tool or data is missing fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
	if [ "$(id -u)" = 0 ]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		echo "cannot run $* : run this script as root or install sudo" >&2
		exit 1
	fi
}

# node_ok: a Node.js 18 or newer with its npm is on the PATH.
node_ok() {
	command -v node >/dev/null && command -v npm >/dev/null || return 1
	local major
	major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) || return 1
	((major >= 18))
}

install_system() {
	local need=()
	command -v clickhouse-server >/dev/null || [ -x /usr/sbin/clickhouse-server ] || command -v clickhouse >/dev/null || need+=(clickhouse-server)
	command -v clickhouse-client >/dev/null || command -v clickhouse >/dev/null || need+=(clickhouse-client)
	command -v gcc >/dev/null || need+=(gcc)
	[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
	command -v make >/dev/null || need+=(make)
	command -v curl >/dev/null || need+=(curl)
	[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
	node_ok || need+=(nodejs npm)
	if ((${#need[@]})); then
		echo "== installing ${need[*]} (apt)"
		as_root apt-get update -q
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
	fi
	if ! node_ok; then
		echo "Node.js 18 or later is needed (found: $(node --version 2>/dev/null || echo none))" >&2
		exit 1
	fi
}

check_go() {
	command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
	if ! command -v go >/dev/null; then
		echo "Go is not installed: get Go 1.26 or later from https://go.dev/dl/ (tar -C /usr/local -xzf go1.26.*.linux-amd64.tar.gz)" >&2
		exit 1
	fi
	local ver major rest minor
	ver=$(go env GOVERSION | sed 's/^go//')
	major=${ver%%.*}; rest=${ver#*.}; minor=${rest%%[.a-z]*}
	if ((major < 1 || (major == 1 && minor < 26))); then
		echo "Go $ver is too old: tokenscope needs Go 1.26 or later (https://go.dev/dl/)" >&2
		exit 1
	fi
}

# install_npm_test_deps: the test dependencies installed with npm, each a Node project with a
# package-lock.json whose node_modules is git-ignored. `npm ci` runs only where node_modules
# is missing or older than the lock file.
install_npm_test_deps() {
	local dir
	for dir in services/emitter/testdata/sdk services/emitter/testdata/otel services/emitter/testdata/claude cli/testdata/natsjs; do
		[ -f "$dir/package-lock.json" ] || continue
		if [ ! -f "$dir/node_modules/.package-lock.json" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
			echo "== npm ci in $dir"
			(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
		fi
	done
}

install_system
check_go
install_npm_test_deps
go version
exec make test "$@"
