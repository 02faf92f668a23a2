#!/bin/sh
# govulncheck over the module (issue 8). Needs the Go vulnerability
# database: https://vuln.go.dev by default, or a local mirror with
# VULNDB=file:///path/to/vulndb. Not part of `make test`: CI machines
# without internet cannot reach the database.
set -eu
cd "$(dirname "$0")/.."
VERSION=${GOVULNCHECK_VERSION:-v1.1.4}
DB=${VULNDB:-https://vuln.go.dev}
if ! go run "golang.org/x/vuln/cmd/govulncheck@$VERSION" -db "$DB" ./...; then
	echo "vulncheck: govulncheck failed: findings above, or $DB unreachable (set VULNDB to a mirror)" >&2
	exit 1
fi
