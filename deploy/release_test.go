package deploy

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// The image name the shipped manifests use (deploy/helm/examples: the name a
// user pushes `make image`'s output to, docs/kubernetes.md); the tag is the
// version.
const imageRepo = "my-registry.example.com/spotagent"

// ociDescriptor, ociIndex, ociManifest and ociConfig are the parts of the OCI
// image spec the test reads, decoded with the standard library only, so the
// check does not trust the library that wrote the image.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type ociIndex struct {
	SchemaVersion int             `json:"schemaVersion"`
	MediaType     string          `json:"mediaType"`
	Manifests     []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Config    ociDescriptor   `json:"config"`
	Layers    []ociDescriptor `json:"layers"`
}

type ociConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		User       string            `json:"User"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// TestRelease runs scripts/release.sh, the script behind `make release`, on a
// small stand-in for cmd/spotagent (the real one takes minutes per
// architecture to compile) and checks what it produced: static binaries for
// both architectures with the version stamped in, SHA256SUMS, and an OCI
// image index holding each binary as a non-root, scratch image.
func TestRelease(t *testing.T) {
	need(t, "sha256sum", "coreutils")
	dist := t.TempDir()
	const version = "v0.0.0-releasetest"
	cmd := exec.Command("bash", "scripts/release.sh")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "VERSION="+version, "DIST="+dist,
		"PKG=./deploy/testdata/fakeagent", "REVISION=0123456789abcdef", "SOURCE_DATE_EPOCH=1700000000")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}

	sums := readSums(t, filepath.Join(dist, "SHA256SUMS"))
	binaries := map[string][]byte{} // arch -> binary
	for _, arch := range []string{"amd64", "arm64"} {
		name := "spotagent-linux-" + arch
		b, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		binaries[arch] = b
		if got, want := sums[name], sha256Hex(b); got != want {
			t.Errorf("SHA256SUMS %s=%q, want %s", name, got, want)
		}
		checkReleaseBinary(t, filepath.Join(dist, name), arch, version)
	}
	tarBytes, err := os.ReadFile(filepath.Join(dist, "spotagent-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sums["spotagent-image.tar"], sha256Hex(tarBytes); got != want {
		t.Errorf("SHA256SUMS spotagent-image.tar=%q, want %s", got, want)
	}
	checkImage(t, tarBytes, binaries, version)
	if _, err := os.Stat(filepath.Join(dist, "spotagent-image", "index.json")); err != nil {
		t.Errorf("no OCI layout directory for crane push: %v", err)
	}
}

func readSums(t *testing.T, path string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q is not sha256sum output", sc.Text())
		}
		sums[name] = sum
	}
	return sums
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// checkReleaseBinary: right architecture, static (no interpreter, no shared
// libraries), built with the release flags, version stamped.
func checkReleaseBinary(t *testing.T, path, arch, version string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != wantMachine {
		t.Errorf("%s: ELF machine %v, want %v", path, f.Machine, wantMachine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has an ELF interpreter: not a static binary", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s: links shared libraries %v", path, libs)
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: build info: %v", path, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "-tags": "disable_grpc_modules,grpcnotrace", "GOARCH": arch, "GOOS": "linux"} {
		if settings[k] != want {
			t.Errorf("%s: build setting %s=%q, want %q", path, k, settings[k], want)
		}
	}
	b, _ := os.ReadFile(path)
	if !bytes.Contains(b, []byte(version)) {
		t.Errorf("%s: version %s not stamped in", path, version)
	}
	if arch == runtime.GOARCH && runtime.GOOS == "linux" {
		out, err := exec.Command(path, "version").Output()
		if got, want := strings.TrimSpace(string(out)), "spotagent "+version; err != nil || got != want {
			t.Errorf("%s version: %q (%v), want %q", path, got, err, want)
		}
	}
}

// checkImage reads the OCI layout tar: every blob matches its digest;
// index.json names one image index tagged with the version; the index has
// linux/amd64 and linux/arm64; each image runs /spotagent as 65532, holds
// exactly that binary and carries the version labels.
func checkImage(t *testing.T, tarBytes []byte, binaries map[string][]byte, version string) {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(tarBytes))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
	if got := string(files["oci-layout"]); !strings.Contains(got, `"imageLayoutVersion"`) {
		t.Fatalf("oci-layout = %q", got)
	}
	blob := func(d ociDescriptor) []byte {
		t.Helper()
		hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
		b, found := files["blobs/sha256/"+hexDigest]
		if !ok || !found {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if sha256Hex(b) != hexDigest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: content does not match its digest or size", d.Digest)
		}
		return b
	}
	var top ociIndex
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("index.json should name one image index, got %+v", top.Manifests)
	}
	if got := top.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != version {
		t.Errorf("index.json ref.name %q, want %q", got, version)
	}
	var idx ociIndex
	if err := json.Unmarshal(blob(top.Manifests[0]), &idx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range idx.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" {
			t.Errorf("manifest %s: platform %+v, want linux/...", m.Digest, m.Platform)
			continue
		}
		arch := m.Platform.Architecture
		seen[arch] = true
		if m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("%s: manifest media type %s", arch, m.MediaType)
		}
		var man ociManifest
		if err := json.Unmarshal(blob(m), &man); err != nil {
			t.Fatal(err)
		}
		var cfg ociConfig
		if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != arch {
			t.Errorf("%s: config platform %s/%s", arch, cfg.OS, cfg.Architecture)
		}
		if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/spotagent" || len(cfg.Config.Cmd) > 0 {
			t.Errorf("%s: entrypoint %q cmd %q, want [/spotagent] and no cmd", arch, cfg.Config.Entrypoint, cfg.Config.Cmd)
		}
		if cfg.Config.User != "65532:65532" {
			t.Errorf("%s: user %q, want 65532:65532 (non-root)", arch, cfg.Config.User)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.source":   "https://github.com/spotagent/spotagent",
			"org.opencontainers.image.revision": "0123456789abcdef",
		} {
			if got := cfg.Config.Labels[k]; got != want {
				t.Errorf("%s: label %s=%q, want %q", arch, k, got, want)
			}
		}
		if len(man.Layers) != 1 || len(cfg.RootFS.DiffIDs) != 1 {
			t.Fatalf("%s: %d layers, %d diff ids: want one (the binary, no base image)", arch, len(man.Layers), len(cfg.RootFS.DiffIDs))
		}
		checkLayer(t, arch, blob(man.Layers[0]), cfg.RootFS.DiffIDs[0], binaries[arch])
	}
	if !seen["amd64"] || !seen["arm64"] || len(idx.Manifests) != 2 {
		t.Errorf("image index platforms %v, want exactly linux/amd64 and linux/arm64", seen)
	}
}

func checkLayer(t *testing.T, arch string, gz []byte, diffID string, binary []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("%s: layer is not gzip: %v", arch, err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if "sha256:"+sha256Hex(raw) != diffID {
		t.Errorf("%s: layer diff id does not match its content", arch)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if strings.TrimPrefix(h.Name, "/") != "spotagent" {
			continue
		}
		if h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 || h.Uid != 0 {
			t.Errorf("%s: /spotagent type %c mode %o uid %d: want a root-owned executable", arch, h.Typeflag, h.Mode, h.Uid)
		}
		b, _ := io.ReadAll(tr)
		if !bytes.Equal(b, binary) {
			t.Errorf("%s: /spotagent in the image is not dist/spotagent-linux-%s", arch, arch)
		}
	}
	if len(names) != 1 {
		t.Errorf("%s: layer holds %q, want only spotagent", arch, names)
	}
}

// TestManifestsNameTheBuiltImage: every container running spotagent uses the
// image `make release` builds, tagged with a version, never :latest, and
// relies on its entrypoint.
func TestManifestsNameTheBuiltImage(t *testing.T) {
	// One version everywhere: user-data's default release and the image tags.
	m := regexp.MustCompile(`(?m)^SPOTAGENT_VERSION="\$\{SPOTAGENT_VERSION:-(v[0-9][^}]*)\}"$`).FindStringSubmatch(read(t, userDataPath))
	if m == nil {
		t.Fatal("user-data.sh pins no SPOTAGENT_VERSION default")
	}
	for _, path := range []string{"kubernetes/sidecar-job.yaml", "kubernetes/multinode-job.yaml", "kubernetes/daemonset.yaml"} {
		for _, c := range agentContainers(t, path) {
			repo, tag, _ := strings.Cut(c.Image, ":")
			if repo != imageRepo || tag != m[1] {
				t.Errorf("%s: %s image %q, want %s:%s (the version user-data installs)", path, c.Name, c.Image, imageRepo, m[1])
			}
			if len(c.Command) > 0 && strings.Join(c.Command, " ") != "/spotagent" {
				t.Errorf("%s: %s command %q: the image's entrypoint is /spotagent", path, c.Name, c.Command)
			}
		}
	}
}

// agentContainers returns the containers of a manifest file that run spotagent.
func agentContainers(t *testing.T, path string) []corev1.Container {
	t.Helper()
	var out []corev1.Container
	for _, o := range decodeManifests(t, path) {
		var spec *corev1.PodSpec
		switch o := o.(type) {
		case *corev1.Pod:
			spec = &o.Spec
		case *batchv1.Job:
			spec = &o.Spec.Template.Spec
		case *appsv1.DaemonSet:
			spec = &o.Spec.Template.Spec
		default:
			continue
		}
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			if strings.Contains(c.Image, "spotagent") || c.Name == "spotagent" {
				out = append(out, c)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no spotagent container", path)
	}
	return out
}
