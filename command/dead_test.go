package command

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/statetest"
	"github.com/cdcout/cdcout/state"
)

// TestMain stops the package's shared test database; every database test
// in package command uses it.
func TestMain(m *testing.M) { mysqltest.RunMain(m) }

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"cdcout"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDeadListAndRetryCommands(t *testing.T) {
	srv := mysqltest.Shared(t)
	db, schema := statetest.New(t, "deadcmd")
	tbl := state.Table(schema, "outbox")
	ins := func(id, pipe, status, lastErr string) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO `+tbl+` (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, status, attempts,
last_error, last_error_at, commit_ts, payload) VALUES (?, ?, 'hook', ?, 'app', 'users', 'u', '[7]', REPEAT('0', 64), ?, 3, ?, NOW(6), NOW(6), '{}')`,
			id, pipe, "g:"+id, status, lastErr); err != nil {
			t.Fatal(err)
		}
	}
	const p1, p2 = "main:app.users:hook", "main:app.users:file"
	ins("00000000-0000-7000-8000-000000000001", p1, "dead", "HTTP 400:\nbad request")
	ins("00000000-0000-7000-8000-000000000002", p2, "dead", "HTTP 422")
	ins("00000000-0000-7000-8000-000000000003", p1, "delivered", "")
	common := []string{"--dsn", srv.DSN, "--state-db", schema}

	code, out, errOut := runCLI(t, append([]string{"dead", "list"}, common...)...)
	if code != 0 {
		t.Fatalf("dead list exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "HTTP 400: bad request") {
		t.Fatalf("table:\n%s", out)
	}
	// Aligned: the PIPE column starts at the same offset on every line.
	if i, j := strings.Index(lines[0], "PIPE"), strings.Index(lines[1], p1); i != j {
		t.Fatalf("columns not aligned (%d vs %d):\n%s", i, j, out)
	}

	code, out, errOut = runCLI(t, append([]string{"dead", "list", "--json", "--pipe", p2}, common...)...)
	if code != 0 {
		t.Fatalf("dead list --json exit %d: %s", code, errOut)
	}
	var row map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &row); err != nil {
		t.Fatalf("not one JSON line: %q: %v", out, err)
	}
	if row["id"] != "00000000-0000-7000-8000-000000000002" || row["pipe"] != p2 || row["lastError"] != "HTTP 422" || row["attempts"] != float64(3) {
		t.Fatalf("json row = %v", row)
	}

	code, out, errOut = runCLI(t, append([]string{"dead", "retry", "--pipe", p1}, common...)...)
	if code != 0 || strings.TrimSpace(out) != "re-queued 1 dead row" {
		t.Fatalf("dead retry --pipe: exit %d, out %q, err %q", code, out, errOut)
	}
	var status string
	var attempts int
	if err := db.QueryRow(`SELECT status, attempts FROM `+tbl+` WHERE id = '00000000-0000-7000-8000-000000000001'`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "pending" || attempts != 0 {
		t.Fatalf("retried row: %s after %d attempts", status, attempts)
	}
	code, _, errOut = runCLI(t, append([]string{"dead", "retry", "--id", "00000000-0000-7000-8000-000000000003"}, common...)...)
	if code != ExitFailure || !strings.Contains(errOut, "no dead row with id") {
		t.Fatalf("retry of a delivered row: exit %d, %q", code, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"dead", "retry"}, common...)...)
	if code != 0 || strings.TrimSpace(out) != "re-queued 1 dead row" {
		t.Fatalf("dead retry (all): exit %d, %q", code, out)
	}
	code, out, _ = runCLI(t, append([]string{"dead", "list"}, common...)...)
	if code != 0 || strings.TrimSpace(out) != "no dead rows" {
		t.Fatalf("empty list: exit %d, %q", code, out)
	}
}

func TestDeadCommandErrors(t *testing.T) {
	code, _, errOut := runCLI(t, "dead", "list")
	if code != ExitConfig || !strings.Contains(errOut, "--dsn") {
		t.Fatalf("no DSN: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCLI(t, "dead", "list", "--dsn", "root:s3cret@tcp(127.0.0.1:1)/", "--state-db", "x")
	if code != ExitFailure || strings.Contains(errOut, "s3cret") || !strings.Contains(errOut, "connect to state database") {
		t.Fatalf("unreachable: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCLI(t, "dead", "list", "--dsn", "root@tcp(127.0.0.1:1)/", "--state-db", "bad-name")
	if code != ExitConfig || !strings.Contains(errOut, "--state-db") {
		t.Fatalf("bad state db: exit %d, %q", code, errOut)
	}
}
