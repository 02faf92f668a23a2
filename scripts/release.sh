#!/usr/bin/env bash
# make release: static spotagent binaries for linux/amd64 and linux/arm64, the
# multi-arch OCI image built from them (no Docker daemon: tools/mkimage), and
# SHA256SUMS over all of it, in dist/.
#
#   dist/spotagent-linux-amd64, dist/spotagent-linux-arm64   static, stripped
#   dist/spotagent-image.tar     OCI image layout as a tar (skopeo oci-archive:)
#   dist/spotagent-image/        the same layout as a directory (crane push)
#   dist/SHA256SUMS              sha256sum -c format; ec2/user-data.sh reads it
#
# VERSION (default: git describe) is stamped into the binaries (-X
# main.version) and the image (tag and labels). Reproducible: the same commit
# and Go version give the same bytes (-trimpath, -buildid=, file times from
# the commit time).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
DIST=${DIST:-dist}
PKG=${PKG:-./cmd/spotagent}          # the test builds a small stand-in instead
PLATFORMS=${PLATFORMS:-linux/amd64 linux/arm64}
REVISION=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
TAGS=disable_grpc_modules,grpcnotrace # as the Makefile's TAGS

[[ "$VERSION" =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || { echo "release: bad VERSION '$VERSION'" >&2; exit 1; }
mkdir -p "$DIST"
dist=$(cd "$DIST" && pwd)

images=()
names=()
for plat in $PLATFORMS; do
	os=${plat%/*} arch=${plat#*/}
	name="spotagent-$os-$arch"
	echo "release: $name $VERSION" >&2
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$GO" build -trimpath -tags "$TAGS" \
		-ldflags "-s -w -buildid= -X main.version=$VERSION" -o "$dist/$name" "$PKG"
	images+=("$plat=$dist/$name")
	names+=("$name")
done

echo "release: spotagent-image.tar (${PLATFORMS// /, })" >&2
(cd tools && "$GO" run ./mkimage -version "$VERSION" -revision "$REVISION" \
	-created "$SOURCE_DATE_EPOCH" -out "$dist/spotagent-image.tar" \
	-layout "$dist/spotagent-image" "${images[@]}")

(cd "$dist" && sha256sum "${names[@]}" spotagent-image.tar > SHA256SUMS)
echo "release: $DIST/SHA256SUMS" >&2
cat "$dist/SHA256SUMS"
