#!/usr/bin/env bash
# Installs the current ClickHouse engine the compatibility tests run on: chDB (ClickHouse
# 26.7 embedded in libchdb, npm package chdb, ~550 MB) for Node.js, into
# pkg/testbed/testdata/chdb/node_modules (git-ignored), at the versions of that folder's
# package-lock.json.
# Does nothing when it is already installed. Without node, npm or the registry, the tests
# that need it skip; under CI=true this script fails instead.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/pkg/testbed/testdata/chdb"
stamp="$dir/node_modules/.package-lock.json"
if [ -f "$stamp" ] && ! [ "$dir/package-lock.json" -nt "$stamp" ] && [ -f "$dir/node_modules/chdb/package.json" ]; then
	exit 0
fi
fail() {
	if [ "${CI:-}" = true ]; then
		echo "cannot install chDB for the ClickHouse 26.7 compatibility tests: $1" >&2
		exit 1
	fi
	echo "warning: chDB not installed ($1): the ClickHouse 26.7 compatibility tests will skip" >&2
	exit 0
}
command -v node >/dev/null || fail "node not found: install Node.js 18 or newer"
command -v npm >/dev/null || fail "npm not found: install Node.js 18 or newer"
echo "installing chDB (ClickHouse 26.7 for Node.js, ~550 MB) into ${dir#"$PWD"/}…"
# npm install, not npm ci: the lock holds the Linux x64 engine only (the registry serves no
# other platform's here), which npm ci refuses as out of sync; npm install keeps the lock.
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error) || fail "npm install failed"
