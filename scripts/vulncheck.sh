#!/bin/sh
# govulncheck over the module (issues 8, 13). Needs the Go vulnerability
# database: https://vuln.go.dev by default, or a local mirror with
# VULNDB=file:///path/to/vulndb. Not part of `make test`: CI machines
# without internet cannot reach the database.
set -eu
cd "$(dirname "$0")/.."
VERSION=${GOVULNCHECK_VERSION:-v1.1.4}
DB=${VULNDB:-https://vuln.go.dev}
# The main module (what ships), then tools/ (the release tooling, its own module).
for dir in . tools; do
	if ! (cd "$dir" && go run "golang.org/x/vuln/cmd/govulncheck@$VERSION" -db "$DB" ./...); then
		echo "vulncheck: govulncheck failed in $dir: findings above, or $DB unreachable (set VULNDB to a mirror)" >&2
		exit 1
	fi
done
