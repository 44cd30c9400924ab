package command

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// runArgs runs cdcout with args and a clean CDCOUT_* environment.
func runArgs(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "CDCOUT_") && k != "CDCOUT_TEST_DSN" {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	var out, errOut strings.Builder
	code := run(ctx, append([]string{"cdcout"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

func yamlFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cdcout.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const testPassword = "Sup3rS3cretPw"

func TestRunBadInput(t *testing.T) {
	dsn := "cdc:" + testPassword + "@tcp(127.0.0.1:1)/"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"malformed yaml", []string{"run", "--config", yamlFile(t, "sinks: [\n  - url: x\n")}, []string{"config:"}},
		{"unknown key", []string{"run", "--dsn", dsn, "--config", yamlFile(t, "sinks:\n  - url: \"stdout:\"\n    retries: 3\n")}, []string{"sinks[0].retries: unknown key (line 3)"}},
		{"duplicate sink names", []string{"run", "--dsn", dsn, "--sink", "a=stdout:", "--sink", "a=http://h.example/x"}, []string{`sinks[1].name: duplicate sink name "a"`}},
		{"no sinks", []string{"run", "--dsn", dsn}, []string{"sinks: no sinks configured"}},
		{"unknown scheme", []string{"run", "--dsn", dsn, "--sink", "ftp://h/x"}, []string{`sinks[0].url: unknown scheme "ftp" (want stdout:, file://, http://, https://, kafka://, nats://, redis://, pubsub://)`}},
		{"bad duration flag", []string{"run", "--dsn", dsn, "--sink", "stdout:", "--lease-ttl", "fast"}, []string{`--lease-ttl: "fast" is not a duration`}},
		{"no dsn", []string{"run", "--sink", "stdout:"}, []string{"dsn: required"}},
		{"unquoted colon", []string{"run", "--config", yamlFile(t, "dsn: u:p@tcp(h:1)/\nsinks:\n  - name: out\n    url: stdout:\n")},
			[]string{"cdcout.yaml: line 4: mapping values are not allowed in this context", `must be quoted, e.g. url: "stdout:"`}},
		{"every problem in one round", []string{"run", "--lease-ttl", "fast", "--config", yamlFile(t, "sinks:\n  - url: http://h.example/x\n    secret: \"whsec_!!\"\n")},
			[]string{`--lease-ttl: "fast" is not a duration`, "dsn: required", "sinks[0].secret: secret starts with whsec_ but the rest is not base64"}},
		{"tuning flags", []string{"run", "--dsn", dsn, "--sink", "stdout:", "--enqueue-batch-size", "0", "--enqueue-flush-interval", "0s",
			"--enqueue-max-buffer", "1", "--shutdown-timeout", "0s", "--dedup-window", "1s"},
			[]string{"enqueue_batch_size: must be positive", "enqueue_flush_interval: must be positive", "shutdown_timeout: must be positive", "dedup_window: 1s must exceed lease_ttl"}},
		{"claim lease", []string{"run", "--dsn", dsn, "--sink", "stdout:", "--claim-lease", "5s"}, []string{"sinks[0].timeout: 10s must be shorter than claim_lease 5s"}},
		{"bad webhook secret", []string{"run", "--dsn", dsn, "--config", yamlFile(t, "sinks:\n  - url: http://h.example/x\n    secret: \"whsec_"+testPassword+"!\"\n")}, []string{"whsec_ but the rest is not base64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runArgs(t, context.Background(), tc.args...)
			if code != ExitConfig {
				t.Errorf("exit code = %d, want %d; stderr %q", code, ExitConfig, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("error is not one line: %q", stderr)
			}
			if strings.Contains(stderr, "config: config:") {
				t.Errorf("prefix doubled: %q", stderr)
			}
			if strings.Contains(stderr, testPassword) || strings.Contains(stderr, "goroutine") {
				t.Errorf("stderr leaks the password or a stack trace: %q", stderr)
			}
		})
	}
}

func TestRunEnvPrecedence(t *testing.T) {
	// An env-only setting that is wrong must be reported under its variable
	// name; the same setting given as a flag wins over it.
	t.Setenv("CDCOUT_LEASE_TTL", "quick")
	var out, errOut strings.Builder
	code := run(context.Background(), []string{"cdcout", "run", "--dsn", "u:p@tcp(127.0.0.1:1)/", "--sink", "stdout:"}, strings.NewReader(""), &out, &errOut)
	if code != ExitConfig || !strings.Contains(errOut.String(), `CDCOUT_LEASE_TTL: "quick" is not a duration`) {
		t.Errorf("code %d, stderr %q", code, errOut.String())
	}
}

func TestRunDatabaseErrors(t *testing.T) {
	srv := mysqltest.Shared(t)
	mc, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	state := srv.CreateDB(t, "runbad")
	srv.Exec(t,
		"CREATE USER IF NOT EXISTS 'cdcrun'@'%' IDENTIFIED BY '"+testPassword+"'",
		"GRANT ALL ON *.* TO 'cdcrun'@'%'",
	)
	wrong := mc.Clone()
	wrong.User, wrong.Passwd = "cdcrun", testPassword+"x"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	code, _, stderr := runArgs(t, ctx, "run", "--dsn", wrong.FormatDSN(), "--state-db", state, "--sink", "stdout:", "--http-addr", "off")
	if code != ExitConfig {
		t.Errorf("wrong password: exit %d, want %d; stderr %q", code, ExitConfig, stderr)
	}
	if !strings.Contains(stderr, "Access denied") || !strings.Contains(stderr, "cdcrun@") {
		t.Errorf("wrong password: stderr %q should say access denied for cdcrun@host", stderr)
	}
	if strings.Contains(stderr, testPassword) {
		t.Errorf("wrong password: stderr leaks the password: %q", stderr)
	}
	if n := strings.Count(strings.TrimSpace(lastLine(stderr)), "\n"); n != 0 {
		t.Errorf("not one line: %q", stderr)
	}

	// A short password is redacted by the DSN's structure, never by a
	// search of the message: with "e", every e of it used to go.
	wrong.Passwd = "e"
	code, _, stderr = runArgs(t, ctx, "run", "--dsn", wrong.FormatDSN(), "--state-db", state, "--sink", "stdout:", "--http-addr", "off")
	if line := lastLine(stderr); code != ExitConfig || !strings.Contains(line, "Access denied for user 'cdcrun'") || strings.Contains(line, "[redacted]") {
		t.Errorf("short password: exit %d, error line %q", code, line)
	}

	unreachable := mc.Clone()
	unreachable.User, unreachable.Passwd = "cdcrun", testPassword
	unreachable.Addr = "127.0.0.1:1"
	unreachable.Timeout = 2 * time.Second
	code, _, stderr = runArgs(t, ctx, "run", "--dsn", unreachable.FormatDSN(), "--state-db", state, "--sink", "stdout:", "--http-addr", "off")
	if code != ExitFailure {
		t.Errorf("unreachable: exit %d, want %d; stderr %q", code, ExitFailure, stderr)
	}
	if !strings.Contains(stderr, "127.0.0.1:1") || strings.Contains(stderr, testPassword) {
		t.Errorf("unreachable: stderr %q should name the address and not the password", stderr)
	}
	// The state database is on that server too: no promise of a retry.
	if strings.Contains(stderr, "keep trying") {
		t.Errorf("unreachable: the log promises a retry, then the command exits: %s", stderr)
	}
}

// lastLine is the cdcout: error line (log lines may precede it).
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestRunStopsGracefully runs the command against a real server and
// cancels it: exit 0.
func TestRunStopsGracefully(t *testing.T) {
	srv := mysqltest.Shared(t)
	state := srv.CreateDB(t, "rungood")
	out := filepath.Join(t.TempDir(), "out.jsonl")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr string
	go func() {
		var code int
		code, _, stderr = runArgs(t, ctx, "run", "--dsn", srv.DSN, "--state-db", state, "--instance", state,
			"--sink", "f=file://"+out, "--http-addr", addr, "--log-format", "json")
		done <- code
	}()
	// Wait until the lease is taken (the engine is running), then stop.
	db := srv.Open(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM `%s`.leases WHERE name = ? AND expires_at > NOW(6)", state), "enqueue/"+state).Scan(&n)
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("engine never took its lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The lease comes before the binlog connection: poll the inspect
	// endpoint until it reports the source connected.
	var body string
	for {
		resp, err := http.Get("http://" + addr + "/v1/source")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = fmt.Sprintf("%d %s", resp.StatusCode, b)
			if resp.StatusCode == 200 && strings.Contains(string(b), `"connected":true`) {
				break
			}
		} else {
			body = err.Error()
		}
		if time.Now().After(deadline) {
			t.Errorf("GET /v1/source never reported connected: %s", body)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Errorf("exit %d after stop, want 0; stderr %s", code, stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop")
	}
	// The stopped replica says so at once: not the leader, not expected.
	code, out, errOut := runCmd(t, "status", "--dsn", srv.DSN, "--state-db", state, "--instance", state, "--json")
	if code != ExitOK {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var st struct {
		Fleet struct {
			Expected int `json:"expected"`
			Replicas []struct {
				Payload struct {
					Role string `json:"role"`
				} `json:"payload"`
			} `json:"replicas"`
		} `json:"fleet"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	if f := st.Fleet; len(f.Replicas) != 1 || f.Replicas[0].Payload.Role != "stopped" || f.Expected != 0 {
		t.Errorf("fleet after a graceful stop: %s", out)
	}
}

func TestRunServerWithoutRowBinlog(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{Args: []string{"--binlog-format=STATEMENT"}})
	state := srv.CreateDB(t, "runstmt")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, _, stderr := runArgs(t, ctx, "run", "--dsn", srv.DSN, "--state-db", state, "--sink", "stdout:", "--http-addr", "off")
	if code != ExitConfig {
		t.Errorf("exit %d, want %d; stderr %q", code, ExitConfig, stderr)
	}
	if !strings.Contains(lastLine(stderr), "binlog_format") {
		t.Errorf("stderr %q should name binlog_format", lastLine(stderr))
	}
}

// post sends POST url with "Authorization: Bearer token" (none when
// token is "") and returns the status and body; err when nothing answers.
func post(url, token string) (int, string, error) {
	req, err := http.NewRequest("POST", url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestRunAdminAPI runs cdcout run with the token in a file and the admin
// API on its own address: the write endpoint refuses without the token
// and works with it, and the token appears in no log line, even at debug.
func TestRunAdminAPI(t *testing.T) {
	srv := mysqltest.Shared(t)
	state := srv.CreateDB(t, "runadmin")
	const token = "run-admin-token-5d0c9b1e7f3a"
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr, adminAddr := mysqltest.FreeAddr(t), mysqltest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var stderr string
	go func() {
		var code int
		code, _, stderr = runArgs(t, ctx, "run", "--dsn", srv.DSN, "--state-db", state, "--instance", state,
			"--sink", "stdout:", "--http-addr", httpAddr, "--admin-addr", adminAddr, "--admin-token-file", tokenFile,
			"--log-format", "json", "--log-level", "debug")
		done <- code
	}()
	url := "http://" + adminAddr + "/v1/dead/retry"
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body, err := post(url, token)
		if err == nil && code == http.StatusOK && strings.Contains(body, `"requeued":0`) {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("POST %s with the token never answered 200 requeued 0: %d %s %v", url, code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, tok := range []string{"", "not-the-admin-token-at-all"} {
		if code, body, err := post(url, tok); err != nil || code != http.StatusUnauthorized {
			t.Errorf("token %q: %d %s %v, want 401", tok, code, body, err)
		}
	}
	if code, body, err := post("http://"+httpAddr+"/v1/dead/retry", token); err != nil || code != http.StatusNotFound {
		t.Errorf("write on --http-addr: %d %s %v, want 404", code, body, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Errorf("exit %d after stop, want 0; stderr %s", code, lastN(stderr, 2000))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop")
	}
	if !strings.Contains(stderr, `"admin":true`) {
		t.Errorf("no log line of the admin listener: %s", lastN(stderr, 2000))
	}
	if strings.Contains(stderr, token) {
		t.Errorf("the admin token is in the log")
	}
}
