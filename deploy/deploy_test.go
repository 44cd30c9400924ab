// Package deploy holds no code: its tests check the deployment artifacts
// in this directory (Grafana dashboard, Prometheus rules, Helm chart) with
// the real tools. That every metric they query exists is checked against
// a running cdcout by e2e's TestDeployMetrics.
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// tool finds a command-line tool on PATH or in GOPATH/bin (where
// .ci/setup go-installs helm and kubeconform), failing under CI=true and
// skipping elsewhere when it is missing.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if gopath, gerr := exec.Command("go", "env", "GOPATH").Output(); gerr == nil {
			p, err = exec.LookPath(filepath.Join(strings.TrimSpace(string(gopath)), "bin", name))
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not installed (CI=true, so this fails; .ci/setup installs it)", name)
		}
		t.Skipf("%s not installed (.ci/setup installs it)", name)
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules runs promtool on the rules and checks that every alert
// says what to do.
func TestAlertRules(t *testing.T) {
	const path = "prometheus/cdcout-alerts.yaml"
	run(t, tool(t, "promtool"), "check", "rules", path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Expr        string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			if r.Annotations["summary"] == "" || len(r.Annotations["description"]) < 80 {
				t.Errorf("alert %s: want a summary and a description that says what to do", r.Alert)
			}
		}
	}
	for _, a := range []string{"CdcoutSourceLagHigh", "CdcoutDeadLettersGrowing", "CdcoutNoEnqueueLeader", "CdcoutReplicaMissing", "CdcoutSinkFailing"} {
		if !alerts[a] {
			t.Errorf("alert %s missing", a)
		}
	}
}

// TestGrafanaDashboard loads the dashboard and checks that every panel
// queries Prometheus through the dashboard's datasource variable (so it
// imports into any Grafana) and that the panels the README promises are
// there.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/cdcout.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string
		Panels []struct {
			Type, Title string
			Datasource  struct{ Type, UID string }
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	titles := map[string]bool{}
	for _, p := range dash.Panels {
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, `job=~"$job"`) {
				t.Errorf("panel %q: query %q does not select $job", p.Title, q.Expr)
			}
		}
	}
	for _, want := range []string{"Source lag", "Throughput per pipe", "Delivery latency (commit → delivered)",
		"Pending per pipe", "Dead per pipe", "Lease holders", "Replicas by version"} {
		if !titles[want] {
			t.Errorf("panel %q missing", want)
		}
	}
}
