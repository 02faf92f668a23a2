// Package watch finds the checkpoints a trainer writes on its own in a
// directory (zero-code mode, spotagent run --watch DIR): which entries are
// checkpoints, their steps, when one is complete, how to hand one to the
// committer without it changing underneath, how to restore one into the
// directory under its original name, and the trainer's pace its
// checkpoints show (pace.go).
package watch

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// DefaultPattern fits Hugging Face Trainer's checkpoint-<step> directories.
const DefaultPattern = "checkpoint-*"

// reserved prefixes the agent's own entries in DIR (staging, restores in
// progress, checkpoints moved aside); they are never checkpoints.
const reserved = ".spotagent-"

// ErrNoStep reports a checkpoint name from which no step can be parsed.
var ErrNoStep = errors.New("no step in the name")

var lastInt = regexp.MustCompile(`[0-9]+`)

// hfName is the name Hugging Face's get_last_checkpoint looks for.
var hfName = regexp.MustCompile(`^checkpoint-[0-9]+$`)

// namer matches checkpoint names and parses their steps.
//
// The step rule: with no step regex, the step is the last run of decimal
// digits in the name, after a file's extension (from its last dot) is
// dropped: checkpoint-500 → 500, epoch=3-step=1200.ckpt → 1200,
// model_v2_00300.pt → 300. A step regex replaces that rule: its first
// capturing group (or, without one, the whole match) is the step.
type namer struct {
	Pattern string         // a filepath.Match glob on the entry's base name
	StepRE  *regexp.Regexp // nil: the last integer
}

// NewNamer checks pattern and compiles stepRegex (empty: the default rule).
func NewNamer(pattern, stepRegex string) (*namer, error) {
	if pattern == "" {
		pattern = DefaultPattern
	}
	if strings.Contains(pattern, "/") {
		return nil, fmt.Errorf("watch pattern %q: matches names directly in DIR, without '/'", pattern)
	}
	if _, err := filepath.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("watch pattern %q: %w", pattern, err)
	}
	n := &namer{Pattern: pattern}
	if stepRegex != "" {
		re, err := regexp.Compile(stepRegex)
		if err != nil {
			return nil, fmt.Errorf("watch step regex: %w", err)
		}
		if re.NumSubexp() > 1 {
			return nil, fmt.Errorf("watch step regex %q: at most one capturing group", stepRegex)
		}
		n.StepRE = re
	}
	return n, nil
}

// Match reports whether name is a checkpoint name (the agent's own
// ".spotagent-" entries never are).
func (n *namer) Match(name string) bool {
	if strings.HasPrefix(name, reserved) {
		return false
	}
	ok, _ := filepath.Match(n.Pattern, name)
	return ok
}

// Step parses the step of a checkpoint named name; isFile says whether it
// is a file (whose extension is dropped first).
func (n *namer) Step(name string, isFile bool) (int64, error) {
	var digits string
	if n.StepRE != nil {
		m := n.StepRE.FindStringSubmatch(name)
		switch {
		case m == nil:
			return 0, fmt.Errorf("%q: %w (the step regex %q does not match)", name, ErrNoStep, n.StepRE)
		case len(m) == 2:
			digits = m[1]
		default:
			digits = m[0]
		}
	} else {
		base := name
		if isFile {
			base = strings.TrimSuffix(name, filepath.Ext(name))
		}
		all := lastInt.FindAllString(base, -1)
		if len(all) == 0 {
			return 0, fmt.Errorf("%q: %w (the step is the last integer in the name; set --watch-step-regex)", name, ErrNoStep)
		}
		digits = all[len(all)-1]
	}
	step, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || step < 0 {
		return 0, fmt.Errorf("%q: %w (%q is not a step)", name, ErrNoStep, digits)
	}
	return step, nil
}

// validName accepts a name that can live directly in DIR.
func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") || strings.HasPrefix(name, reserved) {
		return fmt.Errorf("bad checkpoint name %q", name)
	}
	return nil
}
