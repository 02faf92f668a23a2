package schedule

import (
	"fmt"
	"strings"
	"time"
)

// CloudNotice is the time a cloud documents between its interruption
// notice and the machine's end (docs/operations.md cites each).
type CloudNotice struct {
	Cloud string // metadata.Cloud: aws, gcp, azure
	Name  string // how a message names it
	Lead  time.Duration
}

// CloudNotices are the clouds' documented notices: AWS's two-minute Spot
// interruption warning, GCP's 30 s preemption notice (ACPI soft off, then
// hard off), Azure's Preempt scheduled event (at least 30 s ahead).
var CloudNotices = []CloudNotice{
	{Cloud: "aws", Name: "AWS spot", Lead: 120 * time.Second},
	{Cloud: "gcp", Name: "GCP preemption", Lead: 30 * time.Second},
	{Cloud: "azure", Name: "Azure Preempt", Lead: 30 * time.Second},
}

// Estimate is how long a notice checkpoint would take from the request to
// its commit, from what was measured last (a periodic checkpoint of this
// session, or the journal of an earlier one). What the agent promises,
// whether that fits each cloud's notice, is pkg/supervisor/promise's.
type Estimate struct {
	Bytes int64 // the checkpoint's size
	// Save is the trainer's save (request → done); Upload the data upload
	// (for a pipelined save, from the first early upload); Took the whole
	// request → committed. Zero when unknown.
	Save, Upload, Took time.Duration
	// Rate is the upload rate, bytes/s (0: unknown).
	Rate float64
	// Pipelined: the trainer reported files with `saved`, so the upload
	// overlapped the save.
	Pipelined bool
	// Source says where the figures come from: "checkpoint" (this
	// session's newest), "journal" (an earlier session's), "restore" (only
	// the restored size and the restore's rate: a lower bound).
	Source string
	// Lower: Need is a lower bound (the save and the upload rate were not
	// measured; the restore's download rate stands in for the upload's).
	Lower bool
}

// Known reports whether p holds a prediction.
func (p Estimate) Known() bool { return p.Need() > 0 }

// Need is the predicted time from a notice's checkpoint request to its
// commit: the measured request → committed when there is one, else the
// save and the upload, overlapped when the save was pipelined.
func (p Estimate) Need() time.Duration {
	if p.Took > 0 {
		return p.Took
	}
	if p.Pipelined {
		return max(p.Save, p.Upload)
	}
	return p.Save + p.Upload
}

// Budget is the time a notice of lead leaves for the checkpoint: the
// agent keeps margin before the deadline.
func Budget(lead, margin time.Duration) time.Duration { return max(lead-margin, 0) }

// Fits reports whether a notice checkpoint commits within lead, margin kept.
func (p Estimate) Fits(lead, margin time.Duration) bool {
	return p.Need() <= Budget(lead, margin)
}

// NoticeFor returns the documented notice of cloud (false: none known,
// such as --cloud none or a SIGTERM-only run).
func NoticeFor(cloud string) (CloudNotice, bool) {
	for _, c := range CloudNotices {
		if c.Cloud == cloud {
			return c, true
		}
	}
	return CloudNotice{}, false
}

// Problem says why a notice checkpoint does not commit within c's notice,
// e.g. "checkpoint 80.0 GiB needs ~95s at 860 MB/s (save 12s); GCP
// preemption gives 30s (25s with --margin 5s)"; "" when it fits or
// nothing is known.
func (p Estimate) Problem(c CloudNotice, margin time.Duration) string {
	if !p.Known() || p.Fits(c.Lead, margin) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "checkpoint %s needs ", HumanBytes(p.Bytes))
	if p.Lower {
		b.WriteString("at least ")
	} else {
		b.WriteString("~")
	}
	fmt.Fprintf(&b, "%s", RoundSeconds(p.Need()))
	var parts []string
	if p.Rate > 0 {
		parts = append(parts, "at "+Rate(p.Rate))
	}
	if p.Save > 0 {
		parts = append(parts, fmt.Sprintf("save %s", RoundSeconds(p.Save)))
	}
	if len(parts) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, "; %s gives %s (%s with --margin %s)", c.Name, RoundSeconds(c.Lead), RoundSeconds(Budget(c.Lead, margin)), margin)
	return b.String()
}

// Advice lists what would make a notice checkpoint fit within budget:
// a pipelined save, fewer bytes, more frequent periodic checkpoints.
func (p Estimate) Advice(budget time.Duration) []string {
	var out []string
	if !p.Pipelined && p.Save > 0 && p.Upload > 0 {
		piped := max(p.Save, p.Upload)
		verdict := "would still not fit"
		if piped <= budget {
			verdict = "would fit"
		}
		out = append(out, fmt.Sprintf("report each file with `saved` as it is written (spotagent.torch.save, or req.saved(name)): the upload overlaps the save, ~%s, %s", RoundSeconds(piped), verdict))
	}
	if p.Rate > 0 && p.Bytes > 0 {
		left := budget
		if !p.Pipelined {
			left -= p.Save
		}
		if left > 0 {
			fit := int64(p.Rate * left.Seconds())
			if fit < p.Bytes {
				out = append(out, fmt.Sprintf("save fewer bytes: at %s about %s fits (e.g. the model without the optimizer state, or lower precision)", Rate(p.Rate), HumanBytes(fit)))
			}
		} else {
			out = append(out, "save faster: the trainer's save alone takes longer than the notice leaves")
		}
	}
	out = append(out, "checkpoint more often (a shorter --interval): the notice checkpoint may not commit, and what was trained since the last periodic checkpoint is then lost")
	return out
}

// HumanBytes prints n in binary units: 1.5 GiB, 640 MiB, 12 KiB, 3 B.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// RoundSeconds rounds d for a message: whole seconds from 10 s, tenths
// from 1 s, milliseconds below.
func RoundSeconds(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// Rate prints a rate in bytes/s as MB/s with two significant digits
// below 10 MB/s.
func Rate(bps float64) string {
	v := bps / 1e6
	switch {
	case v < 1:
		return fmt.Sprintf("%.2f MB/s", v)
	case v < 10:
		return fmt.Sprintf("%.1f MB/s", v)
	}
	return fmt.Sprintf("%.0f MB/s", v)
}
