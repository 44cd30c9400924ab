package engine

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// get returns the status and body of GET http://addr+path.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// untilReadyz polls /readyz until its status is want and the body holds
// substr, and returns how long that took.
func untilReadyz(t *testing.T, addr string, want int, substr string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		code, body := get(t, addr, "/readyz")
		if code == want && strings.Contains(body, substr) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("/readyz = %d %q, want %d with %q within %v", code, body, want, substr, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stateUser creates a user of its own with every privilege on the state
// database (and nothing else: not SUPER, so read_only applies to it) and
// returns its DSN and name.
func stateUser(t *testing.T, srv *mysqltest.Server, stateDB string) (dsn, user string) {
	t.Helper()
	user = fmt.Sprintf("cdc_rd%d", time.Now().UnixNano()%1_000_000)
	const pass = "state-pass-7"
	srv.Exec(t,
		"CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+pass+"'",
		"GRANT ALL PRIVILEGES ON `"+stateDB+"`.* TO '"+user+"'@'%'")
	t.Cleanup(func() { srv.Exec(t, "DROP USER '"+user+"'@'%'") })
	mc, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.User, mc.Passwd = user, pass
	return mc.FormatDSN(), user
}

// Issue 14, defects 2 and 3: /readyz, /v1/source and
// cdcout_source_connected tell the truth about the binlog link and about a
// state database that refuses writes, within seconds, and delivery resumes
// within seconds of each heal with nothing lost, nothing enqueued twice
// and every key in order.
//
// read_only and REVOKE behave alike on MariaDB and MySQL here: the state
// user has no SUPER (nor READ_ONLY ADMIN / CONNECTION_ADMIN).
func TestReadyzTellsTheTruth(t *testing.T) {
	srv := mysqltest.Shared(t)
	proxied, proxy := srv.ProxiedDSN(t)
	addr := mysqltest.FreeAddr(t)
	var user string
	h := newHooked(t, "ready", "gtid", func(cfg *config.Config) {
		cfg.DSN = config.DSN(proxied)
		var sdsn string
		sdsn, user = stateUser(t, srv, cfg.StateDB)
		cfg.StateDSN = config.DSN(sdsn)
		cfg.HTTPAddr = addr
		cfg.LeaseTTL = 3 * time.Second
	})
	runEngine(t, h.cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	n := 0
	write := func(k int) {
		for i := 0; i < k; i++ {
			n++
			// Ten keys, each updated in turn: v grows per key.
			if _, err := h.db.Exec("INSERT INTO `"+h.src+"`.t (id, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v)", n%10, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	delivered := func(want int, within time.Duration) time.Duration {
		start := time.Now()
		waitFor(t, fmt.Sprintf("%d deliveries", want), within, func() bool { return h.rcv.count() >= want })
		return time.Since(start)
	}
	write(10)
	delivered(10, 20*time.Second)
	untilReadyz(t, addr, 200, "ready", 10*time.Second)

	// The binlog link blackholed: sockets open, nothing forwarded.
	proxy.Blackhole()
	down := untilReadyz(t, addr, 503, "binlog not connected", 15*time.Second)
	if _, body := get(t, addr, "/v1/source"); !strings.Contains(body, `"connected":false`) {
		t.Fatalf("/v1/source during the outage = %s, want connected false", body)
	}
	if _, body := get(t, addr, "/metrics"); !strings.Contains(body, "cdcout_source_connected 0") {
		t.Fatal("/metrics during the outage does not say cdcout_source_connected 0")
	}
	write(10)
	time.Sleep(2 * time.Second)
	proxy.Heal()
	resumed := delivered(20, 30*time.Second)
	untilReadyz(t, addr, 200, "ready", 15*time.Second)
	t.Logf("source blackholed: /readyz unready after %v; heal to resumed delivery %v", down.Round(10*time.Millisecond), resumed.Round(10*time.Millisecond))

	// The state database read-only for the state user.
	srv.Exec(t, "SET GLOBAL read_only = ON")
	defer srv.Exec(t, "SET GLOBAL read_only = OFF")
	ro := untilReadyz(t, addr, 503, "state database refuses writes", 15*time.Second)
	write(10)
	time.Sleep(2 * time.Second)
	srv.Exec(t, "SET GLOBAL read_only = OFF")
	resumedRO := delivered(30, 30*time.Second)
	readyRO := untilReadyz(t, addr, 200, "ready", 15*time.Second)
	t.Logf("read-only: /readyz unready after %v; heal to resumed delivery %v, to ready %v", ro.Round(10*time.Millisecond), resumedRO.Round(10*time.Millisecond), readyRO.Round(10*time.Millisecond))

	// The state user's write grants revoked.
	srv.Exec(t, "REVOKE INSERT, UPDATE, DELETE ON `"+h.stateDB+"`.* FROM '"+user+"'@'%'")
	rv := untilReadyz(t, addr, 503, "state database refuses writes", 15*time.Second)
	write(10)
	time.Sleep(2 * time.Second)
	srv.Exec(t, "GRANT INSERT, UPDATE, DELETE ON `"+h.stateDB+"`.* TO '"+user+"'@'%'")
	resumedRV := delivered(40, 30*time.Second)
	readyRV := untilReadyz(t, addr, 200, "ready", 15*time.Second)
	t.Logf("grants revoked: /readyz unready after %v; heal to resumed delivery %v, to ready %v", rv.Round(10*time.Millisecond), resumedRV.Round(10*time.Millisecond), readyRV.Round(10*time.Millisecond))

	// Ground truth: every change once in the outbox, delivered in per-key
	// order; a redelivery could only repeat an id.
	recs := records(t, h.db, h.stateDB, "%")
	if got, keys := countRecords(recs); got != n || keys != n {
		t.Fatalf("outbox holds %d records with %d change keys, want %d each (none lost, none twice)", got, keys, n)
	}
	h.rcv.mu.Lock()
	order, dups := append([]delivery(nil), h.rcv.order...), h.rcv.dups
	h.rcv.mu.Unlock()
	if len(order) != n {
		t.Fatalf("%d distinct deliveries, want %d", len(order), n)
	}
	last := map[string]float64{}
	for _, d := range order {
		if d.v <= last[d.key] {
			t.Fatalf("key %s delivered v=%v after v=%v", d.key, d.v, last[d.key])
		}
		last[d.key] = d.v
	}
	t.Logf("%d changes, 0 lost, 0 duplicate records, %d redeliveries (same id)", n, dups)

	// Issue 14, defect 5: a TRUNCATE of the captured table writes no
	// record but is counted (and logged, binlog/tableddl_test.go).
	if _, err := h.db.Exec("TRUNCATE TABLE `" + h.src + "`.t"); err != nil {
		t.Fatal(err)
	}
	series := `cdcout_table_ddl_uncaptured_total{statement="TRUNCATE",table="` + h.src + `.t"} 1`
	waitFor(t, series, 10*time.Second, func() bool {
		_, body := get(t, addr, "/metrics")
		return strings.Contains(body, series)
	})
}

// Issue 14, defect 4: a change whose row images exceed max_row_bytes is
// not delivered but dead-lettered with the reason, keeping its key and
// position and dropping its images; the key's later changes are delivered
// as usual.
func TestMaxRowBytesDeadLetters(t *testing.T) {
	rcv := newReceiver(t)
	s := newSource(t, "maxrow", "id INT PRIMARY KEY, v INT, data LONGBLOB", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{{Name: "hook", URL: rcv.srv.URL}}
		cfg.MaxRowBytes = 64 << 10
	})
	runEngine(t, s.cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel+1)))
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := s.db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("x", 100<<10)
	exec("INSERT INTO `" + s.src + "`.t VALUES (1, 1, 'small')")
	exec("UPDATE `"+s.src+"`.t SET v = 2, data = ? WHERE id = 1", big)            // 100 KiB after: over the ceiling
	exec("UPDATE `" + s.src + "`.t SET v = 3, data = 'small again' WHERE id = 1") // 100 KiB before: over too
	exec("UPDATE `" + s.src + "`.t SET v = 4 WHERE id = 1")
	waitFor(t, "two deliveries", 20*time.Second, func() bool { return rcv.count() >= 2 })
	var dead []string
	waitFor(t, "two dead letters", 10*time.Second, func() bool {
		dead = dead[:0]
		for _, r := range records(t, s.db, s.stateDB, "%") {
			if r.Status == "dead" {
				dead = append(dead, string(r.Payload))
			}
		}
		return len(dead) == 2
	})
	for _, p := range dead {
		if strings.Contains(p, `"after":{`) || strings.Contains(p, `"before":{`) || !strings.Contains(p, `"key":{"id":1}`) {
			t.Fatalf("dead letter payload = %.300s, want the key without row images", p)
		}
	}
	var reason string
	if err := s.db.QueryRow("SELECT last_error FROM `" + s.stateDB + "`.outbox WHERE status = 'dead' LIMIT 1").Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "exceed max_row_bytes 65536") {
		t.Fatalf("dead letter reason = %q, want it to name max_row_bytes", reason)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if got := fmt.Sprint(rcv.order[0].v, rcv.order[1].v); got != "1 4" || rcv.dups != 0 {
		t.Fatalf("delivered v = %s (dups %d), want 1 4: the small changes, in order, once", got, rcv.dups)
	}
}
