package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/spotagent/spotagent/pkg/supervisor/source"
	"github.com/spotagent/spotagent/pkg/watch"
)

// watchOptions are the zero-code mode flags of run and sidecar.
type watchOptions struct {
	dir, pattern, stepRegex, marker, noticeSignal string
	quiet                                         time.Duration
	prune                                         bool

	uid string // --watch-uid, as given
}

func (o *watchOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.dir, "watch", "", "zero-code mode: commit the checkpoints the trainer saves on its own into this directory, and restore the newest into it before the trainer starts (docs/watch.md)")
	fs.StringVar(&o.pattern, "watch-pattern", watch.DefaultPattern, "with --watch: glob of checkpoint names directly in the directory, directories or files (e.g. '*.ckpt', 'model_*.pt')")
	fs.StringVar(&o.stepRegex, "watch-step-regex", "", "with --watch: regexp whose first group (or whole match) is the step in a checkpoint's name (default: the last integer in the name, a file's extension dropped)")
	fs.StringVar(&o.marker, "watch-marker", watch.MarkerAuto, "with --watch: file a directory checkpoint must hold to be complete: auto (trainer_state.json for checkpoint-<N>, Hugging Face), none, or a name")
	fs.DurationVar(&o.quiet, "watch-quiet", watch.DefaultQuiet, "with --watch: a checkpoint is complete once nothing in it changed for this long (and its marker is there)")
	fs.BoolVar(&o.prune, "watch-prune", false, "with --watch: delete checkpoints older than the newest committed one from the directory, keeping --keep of them (off: the trainer's files are never deleted)")
	fs.StringVar(&o.uid, "watch-uid", "", "with --watch: the trainer's uid; every file of a checkpoint must be its own, so that it cannot upload files only the agent may read (default: run: the agent's own, sidecar: the directory's owner; no check when that is the agent's own user)")
	defer inGroup(fs, groupWatch, "watch", "watch-pattern", "watch-step-regex", "watch-marker", "watch-quiet", "watch-prune", "watch-uid", "notice-signal")
	fs.StringVar(&o.noticeSignal, "notice-signal", "", "with --watch: on a termination notice send this signal (e.g. SIGTERM) to the trainer's process group, for frameworks that save when signalled (default: none)")
}

// config returns the supervisor's watch config (nil without --watch).
func (o *watchOptions) config() (*source.WatchConfig, error) {
	if o.dir == "" {
		if o.noticeSignal != "" || o.prune || o.stepRegex != "" || o.pattern != watch.DefaultPattern ||
			o.marker != watch.MarkerAuto || o.quiet != watch.DefaultQuiet || o.uid != "" {
			return nil, fmt.Errorf("--notice-signal, --watch-prune, --watch-pattern, --watch-step-regex, --watch-marker, --watch-quiet and --watch-uid need --watch DIR")
		}
		return nil, nil
	}
	if o.quiet <= 0 {
		return nil, fmt.Errorf("--watch-quiet must be positive")
	}
	if _, err := watch.NewNamer(o.pattern, o.stepRegex); err != nil {
		return nil, fmt.Errorf("--watch-pattern/--watch-step-regex: %w", err)
	}
	// DIR itself is checked once, by watch.New, when the agent opens it.
	c := &source.WatchConfig{Config: watch.Config{Dir: o.dir, Pattern: o.pattern, StepRegex: o.stepRegex, Marker: o.marker, Quiet: o.quiet}, Prune: o.prune}
	if o.uid != "" {
		uid, err := strconv.Atoi(o.uid)
		if err != nil || uid < 0 {
			return nil, fmt.Errorf("--watch-uid: want a numeric uid, got %q", o.uid)
		}
		c.UID = &uid
	}
	if o.noticeSignal != "" {
		sig, err := source.ParseNoticeSignal(o.noticeSignal)
		if err != nil {
			return nil, fmt.Errorf("--notice-signal: %w", err)
		}
		c.NoticeSignal = sig
	}
	return c, nil
}
