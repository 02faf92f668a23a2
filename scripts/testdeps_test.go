// Package scripts holds the check that `make test` needs no command that
// scripts/test-deps.sh does not install (#41 item 0): CI passed once only
// because its machine already had mypy.
package scripts

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// prerequisites are what README.md's prerequisites name (Go, /usr/bin/python3,
// root or sudo for apt-get) and what every Debian has (bash, coreutils, git for
// the clone): no test-deps.sh line needed.
var prerequisites = map[string]bool{
	"go": true, "gofmt": true, "python3": true, "python": true, "/usr/bin/python3": true,
	"sudo": true, "apt-get": true, "git": true, "bash": true, "sh": true,
	"sync": true, "sleep": true, "true": true, "false": true, "env": true, "cat": true,
	"sha256sum": true, "cut": true, "mktemp": true, "chmod": true, "mv": true, "rm": true,
	"cmp": true, "mkdir": true, "dirname": true, "grep": true, "cp": true, "id": true,
}

// shellWords start a recipe line without running a command.
var shellWords = map[string]bool{"cd": true, "for": true, "if": true, "set": true, "done": true, "out": true, "wait": true}

// The ways a test names a command it runs.
var (
	goCommand = []*regexp.Regexp{
		regexp.MustCompile(`exec\.LookPath\("([^"]+)"\)`),
		regexp.MustCompile(`exec\.Command\("([^"]+)"`),
		regexp.MustCompile(`exec\.CommandContext\([^,"\n]+, "([^"]+)"`),
		regexp.MustCompile(`\bneed\(t, "([^"]+)"`), // deploy/: fails, never skips
	}
	pyCommand = []*regexp.Regexp{
		regexp.MustCompile(`shutil\.which\("([^"]+)"\)`),
		regexp.MustCompile(`subprocess\.\w+\(\["([^"]+)"`),
	}
	makeDefault = regexp.MustCompile(`(?m)^([A-Z_]+)\s*[?:]?=\s*([a-z][a-z0-9-]*)\s*$`)
	makeUse     = regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	makeRecipe  = regexp.MustCompile(`(?m)^\t[@-]*(?:cd \S+ && )?([a-z][a-z0-9-]*)(?:\s|$)`)
)

// installed reads the commands test-deps.sh installs: the first word of each
// line of its `tools` list.
func installed(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("test-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(b), "\ntools='\n")
	list, _, ok2 := strings.Cut(list, "\n'\n")
	if !ok || !ok2 {
		t.Fatal("test-deps.sh: no tools='...' list")
	}
	out := map[string]bool{}
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			out[f[0]] = true
		}
	}
	return out
}

// used returns every command the repository's tests, test helpers and
// Makefile test targets run, with where each was seen.
func used(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(cmd, where string) {
		if cmd == "" || strings.HasPrefix(cmd, "-") || (strings.Contains(cmd, "/") && cmd != "/usr/bin/python3") {
			return // a flag, or a path the test built itself
		}
		if _, ok := out[cmd]; !ok {
			out[cmd] = where
		}
	}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		var res []*regexp.Regexp
		switch {
		case strings.HasSuffix(path, ".go"):
			res = goCommand
		case strings.HasSuffix(path, ".py") && strings.Contains(filepath.ToSlash(path), "/tests/"):
			res = pyCommand
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, re := range res {
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				add(m[1], path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, m := range makeDefault.FindAllStringSubmatch(string(mk), -1) {
		defaults[m[1]] = m[2]
	}
	for _, target := range []string{"test", "lint", "kcp", "test-go", "test-python", "fuzz"} {
		recipe := makeTarget(string(mk), target)
		if recipe == "" {
			t.Fatalf("Makefile: no target %s", target)
		}
		for _, m := range makeUse.FindAllStringSubmatch(recipe, -1) {
			if cmd, ok := defaults[m[1]]; ok && m[1] != "TAGS" && m[1] != "FUZZTIME" && m[1] != "MAKE" {
				add(cmd, "Makefile "+target+" ($("+m[1]+"))")
			}
		}
		for _, m := range makeRecipe.FindAllStringSubmatch(recipe, -1) {
			if !shellWords[m[1]] {
				add(m[1], "Makefile "+target)
			}
		}
	}
	return out
}

// makeTarget returns the recipe lines of target.
func makeTarget(mk, target string) string {
	_, rest, ok := strings.Cut(mk, "\n"+target+":")
	if !ok {
		return ""
	}
	var b strings.Builder
	for i, line := range strings.Split(rest, "\n") {
		if i == 0 {
			continue // the prerequisites
		}
		if !strings.HasPrefix(line, "\t") {
			break
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func TestTestDepsInstallsEveryCommand(t *testing.T) {
	have := installed(t)
	seen := used(t)
	// The scan must find the commands known to be used, or it proves nothing.
	for _, cmd := range []string{"mypy", "shellcheck", "systemd-analyze", "promtool", "curl", "chromium"} {
		if _, ok := seen[cmd]; !ok {
			t.Errorf("the scan found no use of %s: scripts/testdeps_test.go's patterns miss how tests run commands", cmd)
		}
	}
	var missing []string
	for cmd, where := range seen {
		if !have[cmd] && !prerequisites[cmd] {
			missing = append(missing, cmd+" (run by "+where+")")
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("make test runs %s, which scripts/test-deps.sh does not install: add it to its tools list", m)
	}
	for cmd := range have {
		if _, ok := seen[cmd]; !ok {
			t.Errorf("scripts/test-deps.sh installs %s, which no test runs", cmd)
		}
	}
}
