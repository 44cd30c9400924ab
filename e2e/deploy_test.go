package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// metricName matches the series names cdcout exports (and the process and
// Go runtime collectors'); Prometheus's own (up, ALERTS) are not on
// /metrics.
var metricName = regexp.MustCompile(`\b(?:cdcout|process|go)_[a-z0-9_]+\b`)

// deployMetricNames are the metric names the Grafana dashboards' queries
// and the Prometheus alert rules under deploy/ use, with the files using
// each.
func deployMetricNames(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("../deploy/grafana/*.json")
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := filepath.Glob("../deploy/prometheus/*.yaml")
	files = append(files, rules...)
	if len(files) < 2 {
		t.Fatalf("found %v under deploy/grafana and deploy/prometheus, want a dashboard and rules", files)
	}
	names := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range metricName.FindAllString(string(b), -1) {
			if !strings.HasSuffix(n, "_") {
				names[n] = append(names[n], filepath.Base(f))
			}
		}
	}
	return names
}

// TestDeployMetrics runs cdcout with a webhook and a file sink, delivers
// changes, scrapes /metrics and checks that every metric the dashboard
// and the alert rules query exists there: a renamed metric must not leave
// a panel empty or an alert that never fires.
func TestDeployMetrics(t *testing.T) {
	want := deployMetricNames(t)
	srv := mysqltest.Shared(t)
	_, src, stateDB, from := srv.NewSource(t, "e2e_deploy", "id INT PRIMARY KEY, v INT NOT NULL")
	recv := newReceiver(t, func(*envelope) (int, time.Duration) { return 200, 0 })
	addr := mysqltest.FreeAddr(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cdcout.yaml")
	cfg := fmt.Sprintf("instance: deploy\nhttp_addr: %q\nsinks:\n  - name: hook\n    url: %s/hook\n  - name: file\n    url: file://%s\n",
		addr, recv.srv.URL, filepath.Join(dir, "out.jsonl"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log := newLogFile(t, "deploy-metrics")
	p := startCdcout(t, log, "run", "--config", cfgPath, "--dsn", srv.DSN, "--state-db", stateDB,
		"--tables", src+".t", "--from", from, "--log-format", "json")
	defer p.kill()
	srv.Exec(t, "INSERT INTO `"+src+"`.t VALUES (1, 0), (2, 0)", "UPDATE `"+src+"`.t SET v = 1 WHERE id = 1")
	var fams map[string]*dto.MetricFamily
	waitFor(t, 60*time.Second, func() (bool, string) {
		if p.exited() {
			t.Fatalf("cdcout exited: %v\n%s", p.err, log.tail(20))
		}
		if len(recv.snapshot()) < 3 {
			return false, fmt.Sprintf("receiver has %d of 3 changes", len(recv.snapshot()))
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = parser.TextToMetricFamilies(strings.NewReader(string(body)))
		if err != nil {
			return false, "parse /metrics: " + err.Error()
		}
		_, rows := fams["cdcout_outbox_rows"]
		_, runway := fams["cdcout_binlog_runway_seconds"]
		return rows && runway, "no cdcout_outbox_rows or cdcout_binlog_runway_seconds yet"
	})
	exists := func(name string) bool {
		if fams[name] != nil {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && fams[base] != nil {
				typ := fams[base].GetType()
				return typ == dto.MetricType_HISTOGRAM || typ == dto.MetricType_SUMMARY
			}
		}
		return false
	}
	var checked []string
	for name, files := range want {
		if !exists(name) {
			t.Errorf("%s (used in %s) is not on /metrics", name, strings.Join(files, ", "))
		}
		checked = append(checked, name)
	}
	sort.Strings(checked)
	t.Logf("%d metric names used under deploy/ exist on /metrics: %s", len(checked), strings.Join(checked, " "))
}
