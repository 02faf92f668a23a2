package scripts

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)
	mdFence   = regexp.MustCompile("(?s)```.*?```")
)

// slug is GitHub's anchor for a heading: lower case, punctuation dropped
// (but - and _), spaces as dashes.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(text, ""), -1) {
		s := slug(m[1])
		for i := 0; out[s]; i++ { // a repeated heading gets -1, -2, ...
			s = slug(m[1]) + "-" + string(rune('1'+i))
		}
		out[s] = true
	}
	return out
}

// Every relative link in the repository's Markdown reaches a file that
// exists and, with #anchor, a heading in it (#41 item 7: protocol.md linked
// storage.md#retention, which did not exist).
func TestDocLinksResolve(t *testing.T) {
	var docs []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "cache" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := mdFence.ReplaceAllString(string(b), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(link, "#")
			target := doc
			if file != "" {
				target = filepath.Join(filepath.Dir(doc), file)
			}
			st, err := os.Stat(target)
			if err != nil {
				t.Errorf("%s: link %s: %s does not exist", doc, link, target)
				continue
			}
			checked++
			if anchor == "" || st.IsDir() || !strings.HasSuffix(target, ".md") {
				continue
			}
			tb, err := os.ReadFile(target)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(string(tb))[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", doc, link, target, anchor)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d links in %d documents: the scan missed them", checked, len(docs))
	}
}
