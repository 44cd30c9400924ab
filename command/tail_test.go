package command

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/wait"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut lockedBuffer
	code = run(ctx, append([]string{"cdcout"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// lockedBuffer is safe for the concurrent writes of several goroutines'
// loggers (the stream's and go-mysql's).
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// failingWriter is a stdout whose every write fails.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

func TestTail(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	db := srv.CreateDB(t, "tail")
	srv.Exec(t,
		"CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, v VARCHAR(10))",
		"CREATE TABLE `"+db+"`.other (id INT PRIMARY KEY)",
		"INSERT INTO `"+db+"`.t VALUES (1, 'a'), (2, 'b')",
		"INSERT INTO `"+db+"`.other VALUES (1)",
		"UPDATE `"+db+"`.t SET v = 'c' WHERE id = 2",
		"DELETE FROM `"+db+"`.t WHERE id = 1",
		"ALTER TABLE `"+db+"`.t ADD COLUMN w INT",
	)

	t.Run("limit", func(t *testing.T) {
		code, out, errOut := runCmd(t, "tail", "--dsn", srv.DSN, "--from", "start", "--tables", db+".t",
			"--limit", "6", "--server-id", "7001", "--log-format", "json")
		if code != ExitOK {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		var got []string
		for _, l := range lines {
			var env struct {
				Op        string
				ChangeKey string `json:"change_key"`
				Key       json.RawMessage
				Source    struct{ Table string }
				DDL       *struct {
					Kind    string
					Columns []struct{ Name, Type, Key string }
				}
			}
			if err := json.Unmarshal([]byte(l), &env); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			if env.DDL != nil {
				var cols []string
				for _, c := range env.DDL.Columns {
					// MariaDB and MySQL before 8.0.19 show int's display width.
					cols = append(cols, c.Name+" "+strings.Replace(c.Type, "int(11)", "int", 1)+" "+c.Key)
				}
				got = append(got, env.Op+" "+env.Source.Table+" "+env.DDL.Kind+" "+strings.Join(cols, ", "))
				continue
			}
			if _, _, err := canonical.UnmarshalEnvelope([]byte(l)); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			got = append(got, env.Op+" "+env.Source.Table+" "+string(env.Key))
			if !strings.HasPrefix(env.ChangeKey, "g:") {
				t.Errorf("change key %q", env.ChangeKey)
			}
		}
		// The CREATE and ALTER of the captured table are records too (the
		// other table's are not) in their place among the rows. Their
		// columns are information_schema's when the statement is read:
		// this tail starts after the ALTER ran, so the CREATE already
		// shows w — the documented limit of a reader that lags behind a
		// later DDL of the same table (docs/ARCHITECTURE.md).
		want := []string{`ddl t CREATE id int PRI, v varchar(10) , w int `, `c t {"id":1}`, `c t {"id":2}`, `u t {"id":2}`, `d t {"id":1}`,
			`ddl t ALTER id int PRI, v varchar(10) , w int `}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("envelopes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// The rows after the CREATE tell, from the binlog's own table map,
		// that its list was a later one: said in the log.
		if !strings.Contains(errOut, "the column list of a schema-change record was information_schema's after a later DDL") {
			t.Errorf("stderr does not report the CREATE's late column list:\n%s", errOut)
		}
		if !strings.Contains(errOut, `"metadata mode":"binlog"`) {
			t.Errorf("stderr does not log the metadata mode:\n%s", errOut)
		}
	})

	t.Run("heartbeat", func(t *testing.T) { testTailHeartbeat(t, srv, db) })
	t.Run("follow", func(t *testing.T) { testTailFollow(t, srv, db) })
	t.Run("transactions", func(t *testing.T) { testTailTransactions(t, srv) })

	t.Run("bad flags", func(t *testing.T) {
		for _, args := range [][]string{
			{"tail", "--dsn", "root:hunter2@tcp(127.0.0.1:3306)"},      // no slash
			{"tail", "--dsn", "root:hunter2/x@tcp(127.0.0.1:3306)"},    // unescaped '/' in the password
			{"tail", "--dsn", "root:hunter2/x%zz@tcp(127.0.0.1:3306)"}, // and a bad escape
			{"tail", "--dsn", srv.DSN, "--from", "yesterday"},
			{"tail", "--dsn", srv.DSN, "--tables", "nodot"},
			{"tail", "--dsn", srv.DSN, "--server-id", "0"},
			{"tail"},
		} {
			code, out, errOut := runCmd(t, args...)
			if code != ExitConfig {
				t.Errorf("%v: exit %d, want %d; stderr %s", args, code, ExitConfig, errOut)
			}
			if (out != "" && len(args) > 1) || strings.Contains(errOut, "hunter") {
				t.Errorf("%v: stdout %q stderr %q", args, out, errOut)
			}
		}
	})

	t.Run("stdout fails", func(t *testing.T) {
		// A write error (a closed pipe, a full disk) ends a following tail
		// at once with the error, though no --limit would end it.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var errOut lockedBuffer
		start := time.Now()
		code := run(ctx, []string{"cdcout", "tail", "--dsn", srv.DSN, "--from", "start", "--tables", db + ".t",
			"--server-id", "7004", "--log-format", "json"}, strings.NewReader(""), failingWriter{}, &errOut)
		if code != ExitFailure || !strings.Contains(errOut.String(), "write stdout: stdout closed") || time.Since(start) > 30*time.Second {
			t.Fatalf("exit %d after %s, stderr:\n%s", code, time.Since(start).Round(time.Millisecond), errOut.String())
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		code, _, errOut := runCmd(t, "tail", "--dsn", "root:hunter2@tcp(127.0.0.1:1)/?timeout=2s")
		if code != ExitFailure || strings.Contains(errOut, "hunter") || !strings.Contains(errOut, "root@127.0.0.1:1") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
	})

	t.Run("no row binlog", func(t *testing.T) {
		srv.Exec(t, "SET GLOBAL binlog_format = 'STATEMENT'")
		defer srv.Exec(t, "SET GLOBAL binlog_format = 'ROW'")
		code, _, errOut := runCmd(t, "tail", "--dsn", srv.DSN, "--log-level", "error")
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != ExitConfig || len(lines) != 1 || !strings.Contains(lines[0], "SET GLOBAL binlog_format = 'ROW'") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
	})
}

// testTailHeartbeat: with nothing written, tail --heartbeat prints
// heartbeats with the position read.
// testTailFollow: a running tail prints each transaction's rows when it
// commits, not only when it exits (its output is buffered).
func testTailFollow(t *testing.T, srv *mysqltest.Server, db string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"cdcout", "tail", "--dsn", srv.DSN, "--tables", db + ".t",
			"--server-id", "7003", "--log-format", "json"}, strings.NewReader(""), &out, &errOut)
	}()
	wait.Until(t, "tail connected", 20*time.Second, func() bool { return strings.Contains(errOut.String(), `"metadata mode"`) })
	for i, want := range []int{3, 4} {
		srv.Exec(t, fmt.Sprintf("INSERT INTO `%s`.t (id, v) VALUES (%d, 'f')", db, 100+i))
		if i == 0 {
			srv.Exec(t, "INSERT INTO `"+db+"`.t (id, v) VALUES (200, 'f'), (201, 'f')")
		}
		wait.Until(t, fmt.Sprintf("%d rows printed", want), 20*time.Second, func() bool {
			return strings.Count(out.String(), `"op":"c"`) == want
		})
		select {
		case c := <-code:
			t.Fatalf("tail exited (%d) before it was stopped; stderr:\n%s", c, errOut.String())
		default:
		}
	}
	cancel()
	if c := <-code; c != ExitOK {
		t.Fatalf("exit %d, stderr:\n%s", c, errOut.String())
	}
}

func testTailHeartbeat(t *testing.T, srv *mysqltest.Server, db string) {
	// Nothing is written: only heartbeats, with the position read.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"cdcout", "tail", "--dsn", srv.DSN, "--tables", db + ".t", "--heartbeat", "200ms",
			"--server-id", "7002", "--log-format", "json"}, strings.NewReader(""), &out, &errOut)
	}()
	var lines []string
	wait.Until(t, "two heartbeats", 20*time.Second, func() bool {
		lines = strings.Split(strings.TrimSpace(out.String()), "\n")
		return len(lines) >= 2
	})
	cancel()
	if c := <-code; c != ExitOK {
		t.Fatalf("exit %d, stderr:\n%s", c, errOut.String())
	}
	for _, l := range lines[:2] {
		var hb struct {
			Op     string
			Source struct {
				File    string
				GTIDSet string `json:"gtid_set"`
			}
		}
		if err := json.Unmarshal([]byte(l), &hb); err != nil || hb.Op != "hb" || hb.Source.File == "" && hb.Source.GTIDSet == "" {
			t.Errorf("line %q (%v): want a heartbeat with the position", l, err)
		}
	}
}

// testTailTransactions: tail --transactions brackets a two-table
// transaction with BEGIN and END (the counts per table), numbers its
// changes in source.tx, and --limit reached inside it stops at its END.
func testTailTransactions(t *testing.T, srv *mysqltest.Server) {
	db := srv.CreateDB(t, "tailtx")
	srv.Exec(t, "CREATE TABLE `"+db+"`.a (id INT PRIMARY KEY)", "CREATE TABLE `"+db+"`.b (id INT PRIMARY KEY)")
	conn := srv.Open(t)
	tx, err := conn.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"INSERT INTO `" + db + "`.a VALUES (1)", "INSERT INTO `" + db + "`.b VALUES (1)",
		"INSERT INTO `" + db + "`.a VALUES (2)"} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "UPDATE `"+db+"`.a SET id = 3 WHERE id = 1")

	// The two CREATEs and two changes reach --limit 4 inside the
	// transaction: its last change and END follow, the UPDATE does not.
	code, out, errOut := runCmd(t, "tail", "--dsn", srv.DSN, "--from", "start", "--tables", db+".*", "--transactions",
		"--limit", "4", "--server-id", "7003", "--log-format", "json")
	if code != ExitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	var got []string
	var txID string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var env struct {
			Op        string
			ChangeKey string `json:"change_key"`
			Source    struct {
				Table, File string
				Tx          *canonical.TxOrder
			}
			Tx *struct {
				ID, Status      string
				EventCount      int `json:"event_count"`
				DataCollections []struct {
					DataCollection string `json:"data_collection"`
					EventCount     int    `json:"event_count"`
				} `json:"data_collections"`
			}
		}
		if err := json.Unmarshal([]byte(l), &env); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		switch {
		case env.Op == "tx" && env.Tx != nil:
			rec := fmt.Sprintf("tx %s %s %d", env.Source.Table, env.Tx.Status, env.Tx.EventCount)
			for _, dc := range env.Tx.DataCollections {
				rec += fmt.Sprintf(" %s=%d", strings.TrimPrefix(dc.DataCollection, db+"."), dc.EventCount)
			}
			if txID == "" {
				txID = env.Tx.ID
			}
			if env.Tx.ID != txID || env.ChangeKey != "t:"+txID+":"+strings.ToLower(env.Tx.Status) || env.Source.File == "" {
				t.Errorf("transaction record %s: id, change key or position wrong (BEGIN's id %s)", l, txID)
			}
			got = append(got, rec)
		case env.Source.Tx != nil:
			if env.Source.Tx.ID != txID {
				t.Errorf("change %s: source.tx.id, want %s", l, txID)
			}
			got = append(got, fmt.Sprintf("%s %s %d/%d", env.Op, env.Source.Table, env.Source.Tx.TotalOrder, env.Source.Tx.TableOrder))
		default:
			got = append(got, env.Op+" "+env.Source.Table)
		}
	}
	want := []string{"ddl a", "ddl b", "tx transaction BEGIN 0", "c a 1/1", "c b 2/1", "c a 3/2", "tx transaction END 3 a=2 b=1"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
