// Package prometheus_test checks the alert rules here and the Grafana
// dashboard in ../grafana against a live agent: every PromQL expression
// parses with the Prometheus parser, names only metrics the agent
// exports, and the rules pass `promtool check rules` and the alert tests
// of spotagent-rules.test.yml (`promtool test rules`).
package prometheus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/metrics"
)

const (
	rulesPath     = "spotagent-rules.yml"
	rulesTestPath = "spotagent-rules.test.yml"
	dashboardPath = "../grafana/spotagent-fleet.json"
)

// prometheusOwn are series Prometheus itself makes for every target.
var prometheusOwn = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped"}

// afterEvents are series a live agent exports only after an event (a
// labelled vector has no series before its first labels): checked against
// the real registry after the call the agent makes on that event.
var afterEvents = map[string]func(m *metrics.Metrics){
	"spotagent_notices_total": func(m *metrics.Metrics) { m.Notice("aws", "termination") },
}

// expr is one PromQL expression and where it comes from.
type expr struct{ where, text string }

func TestMonitoring_Expressions(t *testing.T) {
	live := liveMetricNames(t)
	exprs := append(ruleExprs(t), dashboardExprs(t)...)
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions found: the files were not read as expected", len(exprs))
	}
	p := parser.NewParser(parser.Options{})
	for _, e := range exprs {
		ast, err := p.ParseExpr(grafanaVars(e.text))
		if err != nil {
			t.Errorf("%s: %v\n%s", e.where, err, e.text)
			continue
		}
		names := selectorNames(ast)
		if len(names) == 0 {
			t.Errorf("%s: names no metric: %s", e.where, e.text)
		}
		for _, n := range names {
			if live[n] || slices.Contains(prometheusOwn, n) {
				continue
			}
			if set, ok := afterEvents[n]; ok && registryNames(t, set)[n] {
				continue
			}
			t.Errorf("%s: %s is not a metric the agent exports\n%s", e.where, n, e.text)
		}
	}
}

func TestMonitoring_Promtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found (Debian package prometheus; scripts/test-deps.sh installs it): the rules checks need it")
	}
	for _, args := range [][]string{{"check", "rules", rulesPath}, {"test", "rules", rulesTestPath}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// selectorNames returns the metric names ast selects.
func selectorNames(ast parser.Expr) []string {
	var names []string
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			names = append(names, name)
		}
		return nil
	})
	return names
}

// grafanaVars replaces Grafana's variables with what Grafana would send:
// durations for the interval variables, a regex for the template ones.
func grafanaVars(s string) string {
	for k, v := range map[string]string{"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"} {
		s = strings.ReplaceAll(s, k, v)
	}
	return regexp.MustCompile(`\$\{?[a-z_]+\}?`).ReplaceAllString(s, ".*")
}

func ruleExprs(t *testing.T) []expr {
	t.Helper()
	b, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert  string `json:"alert"`
				Record string `json:"record"`
				Expr   string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	var out []expr
	var alerts []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, expr{rulesPath + ": " + r.Alert + r.Record, r.Expr})
			alerts = append(alerts, r.Alert)
		}
	}
	for _, want := range []string{"SpotagentNoticeCheckpointFailed", "SpotagentNoCheckpointCommitted", "SpotagentDown", "SpotagentGoodputLow"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("%s has no alert %s", rulesPath, want)
		}
	}
	return out
}

func dashboardExprs(t *testing.T) []expr {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var out []expr
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardPath, p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, expr{dashboardPath + ": panel " + p.Title, tg.Expr})
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.*), *([a-z_]+)\)$`)
	for _, v := range d.Templating.List {
		q, ok := v.Query.(map[string]any)
		if v.Type != "query" || !ok {
			continue
		}
		m := labelValues.FindStringSubmatch(fmt.Sprint(q["query"]))
		if m == nil {
			t.Errorf("%s: variable %s: want label_values(selector, label), got %v", dashboardPath, v.Name, q["query"])
			continue
		}
		out = append(out, expr{dashboardPath + ": variable " + v.Name, m[1]})
	}
	// Every panel is labelled by machine: it joins spotagent_instance_info,
	// except Prometheus' own up.
	for _, e := range out {
		if !strings.Contains(e.text, "spotagent_instance_info") && !strings.Contains(e.text, "up{") {
			t.Errorf("%s: not labelled by cloud, instance type and zone: %s", e.where, e.text)
		}
	}
	return out
}

// liveMetricNames builds spotagent, runs `spotagent run --cloud none
// --metrics-addr` around a sleeping trainer, and returns the names on its
// /metrics once it is ready (histograms as their _bucket, _sum, _count).
func liveMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "spotagent")
	build := exec.Command("go", "build", "-tags", "disable_grpc_modules", "-o", bin, "./cmd/spotagent")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build spotagent: %v\n%s", err, out)
	}
	addr := testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "run", "--cloud", "none", "--store", filepath.Join(dir, "store"),
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "agent.sock"),
		"--metrics-addr", addr, "--", "sleep", "120")
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams, err := scrape("http://" + addr)
		if err == nil && gaugeIs(fams, "spotagent_ready", 1) {
			return names(fams)
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready on %s within 60 s (last: %v); its log:\n%s", addr, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, with the deadline above
	}
}

// registryNames returns the names the real registry serves after set.
func registryNames(t *testing.T, set func(m *metrics.Metrics)) map[string]bool {
	t.Helper()
	m := metrics.New()
	set(m)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams, err := scrape(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return names(fams)
}

func scrape(base string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func gaugeIs(fams map[string]*dto.MetricFamily, name string, v float64) bool {
	f := fams[name]
	return f != nil && len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge().GetValue() == v
}

func names(fams map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for n, f := range fams {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[n+"_bucket"], out[n+"_sum"], out[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[n], out[n+"_sum"], out[n+"_count"] = true, true, true
		default:
			out[n] = true
		}
	}
	return out
}
