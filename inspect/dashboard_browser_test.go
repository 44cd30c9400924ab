package inspect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/replay"
)

// chromium finds Debian's headless-capable Chromium. Under CI=true a
// missing browser fails the test: a dashboard nobody rendered is not tested.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not installed (apt-get install -y chromium; .ci/setup does it)")
	}
	t.Skip("chromium not installed")
	return ""
}

// artifactsDir is <module root>/artifacts, gitignored, kept by CI.
func artifactsDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || out.Len() == 0 {
			t.Fatalf("chromium %v: %v\nstderr:\n%s", args, err, lastLines(errOut.String(), 20))
		}
	}
	return out.Bytes()
}

func TestDashboardRendersInChromium(t *testing.T) {
	bin := chromium(t)
	deps := testDeps(t)
	deps.Metrics = metrics.New()
	deps.Source = func() SourceStatus {
		return SourceStatus{Connected: true, Role: "leader", Lag: 800 * time.Millisecond,
			Position:     binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-4242"},
			IdentityMode: "gtid", Flavor: "mariadb", ServerVersion: "10.11", MetadataMode: "binlog",
			Runway: &binlog.Runway{File: "mariadb-bin.000007", PurgeAt: time.Now().Add(3 * time.Hour), Limit: "binlog_expire_logs_seconds=10800"}}
	}
	// A replay half done: one pipe of two finished, 7 records re-delivered.
	rng, err := replay.ParseRange("0-1-4000", "0-1-4100")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id, err := replay.Start(ctx, deps.DB, deps.Schema, "inst", "hook", rng, []string{"inst:shop.orders:hook", "inst:shop.users:hook"}, fixtureID(999), "api")
	if err != nil {
		t.Fatal(err)
	}
	if err := replay.Progress(ctx, deps.DB, deps.Schema, id, "inst:shop.users:hook", fixtureID(7), 7, 0, "", "replica-a/n1"); err != nil {
		t.Fatal(err)
	}
	if err := replay.FinishPipe(ctx, deps.DB, deps.Schema, id, "inst:shop.users:hook", "replica-a/n1"); err != nil {
		t.Fatal(err)
	}
	s := serve(t, Config{Addr: "127.0.0.1:0"}, deps)
	url := fmt.Sprintf("http://%s/", s.Addr())

	dom := string(runChromium(t, bin, "--dump-dom", url))
	for _, want := range []string{
		`data-pipe="inst:shop.orders:hook"`, // a pipe row, built by the script
		deadError,                           // the dead letter's error
		`<code>{"id":6}</code>`,             // and its row key
		"0-1-4242",                          // the source position
		"binlog_expire_logs_seconds=10800",  // the binlog runway
		"drain/inst:shop.orders:hook",       // a lease
		"replica-b",                         // missing from the fleet
		"1/3 responded",
		"connection refused",                                                      // the pipe's last error
		fmt.Sprintf(`data-replay="%d"`, id), "from 0-1-4000 to 0-1-4100", ">1/2<", // the running replay
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered DOM lacks %q", want)
		}
	}
	if strings.Contains(dom, "other instance error") {
		t.Errorf("rendered DOM shows another instance's dead row")
	}
	if strings.Contains(dom, `class="pill bad">/v1/`) {
		t.Errorf("dashboard reports a failed poll")
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	shot := filepath.Join(artifactsDir(t), "dashboard.png")
	os.Remove(shot)
	runChromium(t, bin, "--screenshot="+shot, "--window-size=1280,900", "--hide-scrollbars", url)
	st, err := os.Stat(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if st.Size() < 10_000 {
		t.Errorf("screenshot is only %d bytes", st.Size())
	}
	t.Logf("screenshot: %s (%d bytes)", shot, st.Size())
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
