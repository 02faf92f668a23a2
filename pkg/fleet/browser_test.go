package fleet

import (
	"bytes"
	"context"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// layoutProbe runs in the page once it is laid out and writes what it
// finds on <body data-layout>: the page scrolling sideways, an SVG text
// reaching outside its chart (clipped), a legend mark without its colour.
const layoutProbe = `<script>
const r = [];
const de = document.documentElement;
if (de.scrollWidth > de.clientWidth) r.push("the page scrolls sideways: " + de.scrollWidth + " px wide in a " + de.clientWidth + " px window");
for (const svg of document.querySelectorAll("svg")) {
  const vb = svg.viewBox.baseVal;
  for (const t of svg.querySelectorAll("text")) {
    const b = t.getBBox();
    if (b.x < vb.x - 0.5 || b.x + b.width > vb.x + vb.width + 0.5 || b.y < vb.y - 0.5 || b.y + b.height > vb.y + vb.height + 0.5)
      r.push("#" + svg.id + " clips " + JSON.stringify(t.textContent) + " (x " + Math.round(b.x) + " to " + Math.round(b.x + b.width) + " in a " + vb.width + " px chart)");
  }
  for (const s of svg.querySelectorAll("tspan")) {
    if (getComputedStyle(s).fill === getComputedStyle(s.parentNode).fill)
      r.push("#" + svg.id + ": legend mark " + JSON.stringify(s.textContent) + " has the text's colour, not its own");
  }
}
document.body.setAttribute("data-layout", r.length ? r.join("\n") : "ok");
</script>`

// chromium runs Debian's chromium headless on url in a 1280 × height
// window with extra flags, and returns its stdout.
func chromium(t *testing.T, url string, height int, flags ...string) []byte {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found (Debian package chromium, installed by scripts/test-deps.sh): the fleet page is checked in a real browser")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + t.TempDir(), "--window-size=1280," + strconv.Itoa(height)}, flags...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", flags, err, stderr.String())
	}
	return out
}

// The fleet page in a real browser (#41 item 8): at 1280 px it does not
// scroll sideways, no chart label is clipped, the legend's marks have
// their colours; a screenshot is kept for a person to look at.
func TestWriteHTML_Browser(t *testing.T) {
	root := t.TempDir()
	writeFleet(t, func(dir string) cloud.Store {
		s, err := file.New(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
	st, _ := file.New(root)
	now := at(100 * time.Hour)
	s, damaged, err := Recount(t.Context(), st, now)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Build(s, Options{Now: now, Prices: Prices{Default: Price{Spot: 2, OnDemand: 6}}}, "recount", damaged)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := Write(&b, rep, "html"); err != nil {
		t.Fatal(err)
	}
	// Kept after the test (not t.TempDir): the screenshot is for a person.
	keep, err := os.MkdirTemp("", "spotagent-fleet-page-")
	if err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(keep, "fleet.html")
	probed := filepath.Join(keep, "fleet-probe.html")
	shot := filepath.Join(keep, "fleet.png")
	if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	withProbe := strings.Replace(b.String(), "</body>", layoutProbe+"\n</body>", 1)
	if err := os.WriteFile(probed, []byte(withProbe), 0o644); err != nil {
		t.Fatal(err)
	}

	dom := chromium(t, "file://"+probed, 900, "--dump-dom")
	m := regexp.MustCompile(`data-layout="([^"]*)"`).FindSubmatch(dom)
	if m == nil {
		t.Fatalf("the layout probe did not run; chromium's DOM:\n%s", dom)
	}
	if got := html.UnescapeString(string(m[1])); got != "ok" {
		t.Errorf("the fleet page at 1280 px:\n%s", got)
	}

	chromium(t, "file://"+page, 1400, "--hide-scrollbars", "--screenshot="+shot)
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("no screenshot at %s: %v", shot, err)
	}
	t.Logf("the fleet page at 1280 px: %s (page: %s)", shot, page)
}
