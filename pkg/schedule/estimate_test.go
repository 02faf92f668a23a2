package schedule

import (
	"strings"
	"testing"
	"time"
)

func TestEstimate_NeedAndFits(t *testing.T) {
	gcp, _ := NoticeFor("gcp")
	aws, _ := NoticeFor("aws")
	serial := Estimate{Bytes: 80 << 30, Save: 12 * time.Second, Upload: 100 * time.Second, Rate: 860e6}
	if got, want := serial.Need(), 112*time.Second; got != want {
		t.Fatalf("serial need %s, want %s (save + upload)", got, want)
	}
	piped := serial
	piped.Pipelined = true
	if got, want := piped.Need(), 100*time.Second; got != want {
		t.Fatalf("pipelined need %s, want %s (the longer of save and upload)", got, want)
	}
	measured := serial
	measured.Took = 95 * time.Second
	if got := measured.Need(); got != 95*time.Second {
		t.Fatalf("need %s, want the measured request → committed 95s", got)
	}
	margin := 5 * time.Second
	if !measured.Fits(aws.Lead, margin) || measured.Fits(gcp.Lead, margin) {
		t.Fatalf("95 s: want it to fit AWS's 115 s and not GCP's 25 s")
	}
	// The margin is kept: 116 s does not fit 120 s with 5 s kept.
	if (Estimate{Took: 116 * time.Second}).Fits(aws.Lead, margin) {
		t.Fatal("116 s fits AWS's 120 s minus a 5 s margin")
	}
	if (Estimate{}).Known() {
		t.Fatal("an empty estimate is known")
	}
}

func TestEstimate_ProblemAndAdvice(t *testing.T) {
	gcp, _ := NoticeFor("gcp")
	aws, _ := NoticeFor("aws")
	p := Estimate{Bytes: 80 << 30, Save: 12 * time.Second, Upload: 100 * time.Second, Took: 95 * time.Second, Rate: 860e6}
	got := p.Problem(gcp, 5*time.Second)
	want := "checkpoint 80.0 GiB needs ~1m35s (at 860 MB/s, save 12s); GCP preemption gives 30s (25s with --margin 5s)"
	if got != want {
		t.Fatalf("problem\n got %q\nwant %q", got, want)
	}
	if s := p.Problem(aws, 5*time.Second); s != "" {
		t.Fatalf("fits AWS, yet problem %q", s)
	}
	adv := strings.Join(p.Advice(25*time.Second), "\n")
	for _, w := range []string{"`saved`", "would still not fit", "fewer bytes: at 860 MB/s about 10.4 GiB fits", "--interval"} {
		if !strings.Contains(adv, w) {
			t.Errorf("advice lacks %q:\n%s", w, adv)
		}
	}
	// Pipelined already: no advice to pipeline; what fits is rate × budget.
	p.Pipelined = true
	adv = strings.Join(p.Advice(25*time.Second), "\n")
	if strings.Contains(adv, "`saved`") || !strings.Contains(adv, "about 20.0 GiB fits") {
		t.Errorf("pipelined advice:\n%s", adv)
	}
	// A save that alone overruns the budget.
	slow := Estimate{Bytes: 1 << 30, Save: 40 * time.Second, Upload: time.Second, Rate: 1e9}
	if adv := strings.Join(slow.Advice(25*time.Second), "\n"); !strings.Contains(adv, "save faster") {
		t.Errorf("a 40 s save against 25 s: advice\n%s", adv)
	}
	lower := Estimate{Bytes: 8 << 30, Upload: 40 * time.Second, Rate: 215e6, Lower: true}
	if s := lower.Problem(gcp, 5*time.Second); !strings.Contains(s, "needs at least 40s") {
		t.Fatalf("lower bound: %q", s)
	}
}
