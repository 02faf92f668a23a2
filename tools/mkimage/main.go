// Command mkimage builds spotagent's container image without a Docker daemon:
// one multi-arch OCI image index whose images hold nothing but the static
// binary (no base image, no shell, no libc), written as an OCI image layout
// directory and the same layout as one tar file.
//
//	mkimage -version v1.2.3 -out dist/spotagent-image.tar \
//	    linux/amd64=dist/spotagent-linux-amd64 linux/arm64=dist/spotagent-linux-arm64
//
// Push the result with `skopeo copy --all oci-archive:dist/spotagent-image.tar
// docker://ghcr.io/spotagent/spotagent:v1.2.3` or `crane push
// dist/spotagent-image ghcr.io/spotagent/spotagent:v1.2.3`.
//
// The output is reproducible: same binaries and flags, same digests
// (file times come from -created, the layer is gzipped deterministically).
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's user: the conventional "nonroot" uid/gid of distroless images.
// Numeric, so no /etc/passwd is needed; Kubernetes runAsUser may override it.
const user = "65532:65532"

// binaryPath is where the binary lives in the image, and the entrypoint.
const binaryPath = "/spotagent"

type options struct {
	version, source, revision string
	created                   time.Time
	out, layoutDir            string
	binaries                  []platformBinary
}

type platformBinary struct {
	platform v1.Platform
	path     string
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func parseArgs(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.StringVar(&o.version, "version", "", "image version (label org.opencontainers.image.version)")
	fs.StringVar(&o.source, "source", "https://github.com/spotagent/spotagent", "source repository (label)")
	fs.StringVar(&o.revision, "revision", "", "source revision, a commit id (label)")
	created := fs.Int64("created", sourceDateEpoch(), "creation time, seconds since the epoch (default $SOURCE_DATE_EPOCH or 0)")
	fs.StringVar(&o.out, "out", "dist/spotagent-image.tar", "OCI layout tar file to write")
	fs.StringVar(&o.layoutDir, "layout", "", "also keep the OCI layout directory here (for crane push)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mkimage [flags] os/arch=binary...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.version == "" {
		return o, errors.New("-version is required")
	}
	o.created = time.Unix(*created, 0).UTC()
	for _, a := range fs.Args() {
		plat, path, ok := strings.Cut(a, "=")
		osName, arch, ok2 := strings.Cut(plat, "/")
		if !ok || !ok2 || osName == "" || arch == "" || path == "" {
			return o, fmt.Errorf("argument %q: want os/arch=binary", a)
		}
		o.binaries = append(o.binaries, platformBinary{v1.Platform{OS: osName, Architecture: arch}, path})
	}
	if len(o.binaries) == 0 {
		return o, errors.New("no binaries: give os/arch=path arguments")
	}
	return o, nil
}

func sourceDateEpoch() int64 {
	n, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func run(o options) error {
	idx, err := buildIndex(o)
	if err != nil {
		return err
	}
	dir := o.layoutDir
	if dir == "" {
		tmp, err := os.MkdirTemp(filepath.Dir(o.out), ".mkimage-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.RemoveAll(dir); err != nil {
		return err
	}
	// index.json names one entry, the multi-arch index, tagged with the
	// version: skopeo's oci-archive: and `crane push` of the directory both
	// take it without further selection.
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": o.version,
	})); err != nil {
		return fmt.Errorf("write index: %w", err)
	}
	return tarDir(dir, o.out, o.created)
}

// buildIndex makes one image per binary and the index over them.
func buildIndex(o options) (v1.ImageIndex, error) {
	labels := map[string]string{
		"org.opencontainers.image.title":    "spotagent",
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.created":  o.created.Format(time.RFC3339),
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range o.binaries {
		img, err := buildImage(b, o.created, labels)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", b.platform.OS, b.platform.Architecture, err)
		}
		plat := b.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &plat},
		})
	}
	return mutate.Annotations(idx, labels).(v1.ImageIndex), nil
}

func buildImage(b platformBinary, created time.Time, labels map[string]string) (v1.Image, error) {
	bin, err := os.ReadFile(b.path)
	if err != nil {
		return nil, err
	}
	layerTar, err := singleFileTar(binaryPath, bin, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "mkimage: COPY spotagent " + binaryPath},
		MediaType: types.OCILayer,
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = b.platform.OS, b.platform.Architecture, b.platform.Variant
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{binaryPath},
		User:       user,
		WorkingDir: "/",
		Labels:     labels,
		// No shell in the image; a PATH lets `command: [spotagent]` resolve too.
		Env: []string{"PATH=/"},
	}
	return mutate.ConfigFile(img, cf)
}

// singleFileTar is a layer holding one executable owned by root.
func singleFileTar(name string, data []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     strings.TrimPrefix(name, "/"),
		Mode:     0o755,
		Size:     int64(len(data)),
		ModTime:  mtime,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the files under dir into out (sorted, fixed times and
// owners), through a temp file renamed into place.
func tarDir(dir, out string, mtime time.Time) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	for _, p := range files {
		if err := addFile(tw, dir, p, mtime); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

func addFile(tw *tar.Writer, dir, p string, mtime time.Time) error {
	rel, err := filepath.Rel(dir, p)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     filepath.ToSlash(rel),
		Mode:     0o644,
		Size:     st.Size(),
		ModTime:  mtime,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
