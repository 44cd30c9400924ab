package command

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestRunCrash kills the real binary with SIGKILL at random moments under a
// steady write load and restarts it. Afterwards the outbox must hold
// exactly one row per (change, pipe), the webhook receiver must have every
// change (a redelivery only ever with the same webhook-id) and each key's
// changes in commit order. Both identity modes.
func TestRunCrash(t *testing.T) {
	kills := 30
	if testing.Short() {
		kills = 5
	}
	bin := filepath.Join(t.TempDir(), "cdcout")
	build := exec.Command("go", "build", "-o", bin, "github.com/cdcout/cdcout")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, mode := range []string{"gtid", "digest"} {
		t.Run(mode, func(t *testing.T) { testCrash(t, bin, mode, kills) })
	}
}

type crashReceiver struct {
	mu     sync.Mutex
	byID   map[string]int
	byKey  map[string][]int64 // v of each first receipt, arrival order
	change map[string]string  // "key/op/v" → webhook-id
	bad    []string
}

func testCrash(t *testing.T, bin, mode string, kills int) {
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "crash_src")
	stateDB := srv.CreateDB(t, "crash_state")
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v BIGINT NOT NULL)")
	db := srv.Open(t)
	var from string
	if err := db.QueryRow("SELECT @@gtid_binlog_pos").Scan(&from); err != nil {
		t.Fatal(err)
	}

	rcv := &crashReceiver{byID: map[string]int{}, byKey: map[string][]int64{}, change: map[string]string{}}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		var env struct {
			Op     string `json:"op"`
			Key    struct{ ID int64 }
			After  *struct{ V int64 }
			Before *struct{ V int64 }
		}
		if err := json.Unmarshal(b, &env); err != nil {
			w.WriteHeader(400)
			return
		}
		v := int64(0)
		if env.After != nil {
			v = env.After.V
		} else if env.Before != nil {
			v = env.Before.V
		}
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		rcv.byID[id]++
		if rcv.byID[id] > 1 {
			return
		}
		ck := fmt.Sprintf("%d/%s/%d", env.Key.ID, env.Op, v)
		if prev, dup := rcv.change[ck]; dup {
			rcv.bad = append(rcv.bad, fmt.Sprintf("change %s delivered under two ids %s and %s", ck, prev, id))
			return
		}
		rcv.change[ck] = id
		k := fmt.Sprint(env.Key.ID)
		rcv.byKey[k] = append(rcv.byKey[k], v)
	}))
	defer hook.Close()

	instance := "crash" + mode
	args := []string{"run", "--dsn", srv.DSN, "--state-db", stateDB, "--instance", instance, "--replica-id", "r1",
		"--from", from, "--change-identity", mode, "--tables", src + ".*", "--sink", "hook=" + hook.URL,
		"--http-addr", "off", "--lease-ttl", "1s",
		// A killed replica's claimed rows wait out the claim lease before
		// another drainer takes them; keep it just above the 10s timeout.
		"--claim-lease", "11s", "--log-format", "json", "--log-level", "warn"}
	logs := t.TempDir()
	start := func(n int) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		// A small buffer ceiling: the 150-row transactions below are then
		// written in parts before their commit, and kills land inside them.
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
			"CDCOUT_ENQUEUE_MAX_BUFFER=100", "CDCOUT_ENQUEUE_BATCH_SIZE=50"}
		f, err := os.Create(filepath.Join(logs, fmt.Sprintf("run%02d.log", n)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	dumpLogs := func() {
		ents, _ := os.ReadDir(logs)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(logs, e.Name()))
			if len(b) > 0 {
				t.Logf("%s:\n%s", e.Name(), lastN(string(b), 2000))
			}
		}
	}

	// The writer: one goroutine, so its model of the table is exact. Every
	// write sets v to a fresh, increasing number, which identifies the
	// change and orders a key's changes.
	type change struct {
		key int
		op  string
		v   int64
	}
	var (
		wmu      sync.Mutex
		expected []change
	)
	stopWriter := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		exists := map[int]bool{}
		var seq, txn int64
		for {
			select {
			case <-stopWriter:
				writerDone <- nil
				return
			default:
			}
			tx, err := db.Begin()
			if err != nil {
				writerDone <- err
				return
			}
			var batch []change
			txn++
			n := 1 + rng.IntN(8)
			if txn%40 == 0 {
				n = 150 // a big transaction: every id once
			}
			for i := range n {
				id := 1 + rng.IntN(150)
				if n == 150 {
					id = i + 1
				}
				seq++
				var q string
				var c change
				switch {
				case !exists[id]:
					q, c = fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d, %d)", src, id, seq), change{id, "c", seq}
				case rng.IntN(4) == 0:
					var v int64
					if err := tx.QueryRow(fmt.Sprintf("SELECT v FROM `%s`.t WHERE id = %d", src, id)).Scan(&v); err != nil {
						tx.Rollback()
						writerDone <- err
						return
					}
					q, c = fmt.Sprintf("DELETE FROM `%s`.t WHERE id = %d", src, id), change{id, "d", v}
				default:
					q, c = fmt.Sprintf("UPDATE `%s`.t SET v = %d WHERE id = %d", src, seq, id), change{id, "u", seq}
				}
				if _, err := tx.Exec(q); err != nil {
					tx.Rollback()
					writerDone <- err
					return
				}
				exists[id] = c.op != "d"
				batch = append(batch, c)
			}
			if err := tx.Commit(); err != nil {
				writerDone <- err
				return
			}
			wmu.Lock()
			expected = append(expected, batch...)
			wmu.Unlock()
			time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
		}
	}()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := range kills {
		cmd := start(i)
		time.Sleep(time.Duration(300+rng.IntN(1700)) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	close(stopWriter)
	if err := <-writerDone; err != nil {
		t.Fatalf("writer: %v", err)
	}
	wmu.Lock()
	want := expected
	wmu.Unlock()

	// A last run, left alone, must bring everything home and stop cleanly.
	cmd := start(kills)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		rcv.mu.Lock()
		n := len(rcv.change)
		rcv.mu.Unlock()
		if n >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("receiver has %d of %d changes", n, len(want))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			dumpLogs()
			t.Errorf("last run after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		t.Errorf("last run did not stop after SIGTERM")
	}

	// Outbox: one row per (change, pipe).
	pipe := instance + ":" + src + ".t:hook"
	var rows, keys int
	if err := db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT change_key) FROM `"+stateDB+"`.outbox WHERE pipe = ?", pipe).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != len(want) || keys != len(want) {
		t.Errorf("outbox: %d rows, %d distinct change keys; want %d of each", rows, keys, len(want))
	}

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, b := range rcv.bad {
		t.Error(b)
	}
	redeliveries := 0
	for _, n := range rcv.byID {
		redeliveries += n - 1
	}
	wantByKey := map[string][]int64{}
	for _, c := range want {
		k := fmt.Sprint(c.key)
		wantByKey[k] = append(wantByKey[k], c.v)
		if _, ok := rcv.change[fmt.Sprintf("%d/%s/%d", c.key, c.op, c.v)]; !ok {
			t.Errorf("change %d/%s/%d never delivered", c.key, c.op, c.v)
			var ck, st string
			if err := db.QueryRow("SELECT change_key, status FROM `"+stateDB+"`.outbox WHERE pipe = ? AND row_key = ? AND JSON_VALUE(payload, '$.op') = ? AND JSON_VALUE(payload, IF(? = 'd', '$.before.v', '$.after.v')) = ?",
				pipe, fmt.Sprintf(`{"id":%d}`, c.key), c.op, c.op, c.v).Scan(&ck, &st); err != nil {
				t.Logf("  not in the outbox (%v)", err)
			} else {
				t.Logf("  outbox: %s %s", ck, st)
			}
		}
	}
	for k, vs := range rcv.byKey {
		if !sort.SliceIsSorted(vs, func(i, j int) bool { return vs[i] < vs[j] }) {
			t.Errorf("key %s delivered out of commit order: %v", k, vs)
		}
	}
	t.Logf("%s: %d kills, %d changes, %d redeliveries with the same webhook-id", mode, kills, len(want), redeliveries)
	if t.Failed() {
		crashDiagnostics(t, db, stateDB, pipe)
		dumpLogs()
		st, _ := db.Query("SELECT status, COUNT(*), IFNULL(MAX(last_error), ''), IFNULL(MAX(claimed_by), '') FROM `" + stateDB + "`.outbox GROUP BY status")
		for st != nil && st.Next() {
			var s, le, cb string
			var n int
			_ = st.Scan(&s, &n, &le, &cb)
			t.Logf("outbox %s: %d (last error %q, claimed by %s)", s, n, le, cb)
		}
	}
}

// crashDiagnostics logs what a failed crash run left behind.
func crashDiagnostics(t *testing.T, db *sql.DB, stateDB, pipe string) {
	q := func(query string, args ...any) {
		rows, err := db.Query(query, args...)
		if err != nil {
			t.Logf("%s: %v", query, err)
			return
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			_ = rows.Scan(ptrs...)
			var parts []string
			for i, v := range vals {
				parts = append(parts, cols[i]+"="+v.String)
			}
			t.Log(strings.Join(parts, " "))
		}
	}
	ob := "`" + stateDB + "`.outbox"
	q("SELECT id, row_key, status, attempts, claimed_by, claim_expires_at, NOW(6) now, next_attempt_at, change_key FROM "+ob+" WHERE pipe = ? AND status IN ('pending','delivering') ORDER BY id LIMIT 20", pipe)
	q("SELECT change_key FROM " + ob + " WHERE change_key NOT REGEXP '^g:[0-9]+-[0-9]+-[0-9]+:[0-9]+$' AND change_key NOT LIKE 'd:%' LIMIT 10")
	q("SELECT * FROM `" + stateDB + "`.checkpoints")
}

func lastN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
