package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/outbox"
)

// The benchmarks of issue 3, run against the real binary (`make bench`):
//
//   - BenchmarkEndToEndBinary: 200k inserts + 50k updates + 50k deletes
//     through a file sink and an HTTP sink, first commit to last delivery,
//     beside a bare go-mysql read of the same binlog range. Target ≥ 20,000
//     changes/s.
//   - BenchmarkLatency: commit → webhook arrival at a steady 2,000
//     changes/s. Target p99 ≤ 200 ms.
//   - BenchmarkHugeTransactionRSS: peak RSS (VmHWM) of cdcout while one
//     1,000,000-row transaction goes through a file sink. Target ≤ 200 MB.
//
// CDCOUT_BENCH_ROWS scales the first (inserts; a quarter as many updates
// and deletes) and the third (rows of the transaction);
// CDCOUT_BENCH_SECONDS sets the latency run's length (default 15).
// CDCOUT_BENCH_CHILD_GOMAXPROCS sets GOMAXPROCS for the cdcout binary alone.

// countingHook is a webhook receiver that counts distinct delivery ids and
// calls onBody (if set) for each first delivery.
type countingHook struct {
	srv    *httptest.Server
	onBody func(body []byte, at time.Time)

	mu       sync.Mutex
	ids      map[string]bool
	requests int
}

func newCountingHook(b testing.TB, onBody func([]byte, time.Time)) *countingHook {
	h := &countingHook{ids: map[string]bool{}, onBody: onBody}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		at := time.Now()
		if strings.HasPrefix(r.Header.Get("webhook-id"), "batch_") || bytes.HasPrefix(body, []byte("[")) {
			// A batch (http: {batch: true}): count each record by its id.
			var recs []json.RawMessage
			if err := json.Unmarshal(body, &recs); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			for _, rec := range recs {
				var env struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(rec, &env); err != nil || env.ID == "" {
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				h.seen(env.ID, rec, at)
			}
			h.mu.Lock()
			h.requests++
			h.mu.Unlock()
			return
		}
		h.mu.Lock()
		h.requests++
		h.mu.Unlock()
		h.seen(r.Header.Get("webhook-id"), body, at)
	}))
	b.Cleanup(h.srv.Close)
	return h
}

// seen counts one record; onBody sees its first arrival.
func (h *countingHook) seen(id string, body []byte, at time.Time) {
	h.mu.Lock()
	first := !h.ids[id]
	h.ids[id] = true
	h.mu.Unlock()
	if first && h.onBody != nil {
		h.onBody(body, at)
	}
}

func (h *countingHook) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

// lineCounter counts the lines of a growing file, reading only what was
// appended since the last call.
type lineCounter struct {
	path  string
	off   int64
	lines int
}

func (c *lineCounter) count() int {
	f, err := os.Open(c.path)
	if err != nil {
		return c.lines
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		n, err := f.ReadAt(buf, c.off)
		c.lines += bytes.Count(buf[:n], []byte{'\n'})
		c.off += int64(n)
		if err != nil || n == 0 {
			return c.lines
		}
	}
}

// peakRSS returns the process's VmHWM (peak resident set) in bytes.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// waitLeader waits until the instance's enqueue lease is held, so that a
// benchmark's clock starts with cdcout reading, not starting.
func waitLeader(b testing.TB, p *proc, srv *mysqltest.Server, stateDB, instance string) {
	db := srv.Open(b)
	waitFor(b, 60*time.Second, func() (bool, string) {
		if p.exited() {
			b.Fatalf("cdcout exited: %v", p.err)
		}
		var n int
		_ = db.QueryRow("SELECT COUNT(*) FROM `"+stateDB+"`.leases WHERE name = ? AND expires_at > NOW(6)", "enqueue/"+instance).Scan(&n)
		return n > 0, "enqueue lease not acquired"
	})
}

func benchRun(b testing.TB, srv *mysqltest.Server, stateDB, instance string, extra ...string) (*proc, *logFile) {
	log := newLogFile(b, "bench-"+instance)
	args := append([]string{"run", "--dsn", srv.DSN, "--state-db", stateDB, "--instance", instance,
		"--replica-id", "bench-" + instance, "--http-addr", "off", "--log-format", "json"}, extra...)
	p := startCdcout(b, log, args...)
	waitLeader(b, p, srv, stateDB, instance)
	return p, log
}

// BenchmarkEndToEndBinary runs the real binary from the first commit to the
// last delivery of CDCOUT_BENCH_ROWS inserts (default 200,000) plus a
// quarter as many updates and deletes, through a file sink and a webhook:
// once with one POST per record (webhook=single), once with the webhook's
// batch mode (webhook=batch, http: {batch: true}, 100 records per POST).
func BenchmarkEndToEndBinary(b *testing.B) {
	for _, batch := range []bool{false, true} {
		name := "webhook=single"
		if batch {
			name = "webhook=batch"
		}
		b.Run(name, func(b *testing.B) { benchEndToEnd(b, batch) })
	}
}

func benchEndToEnd(b *testing.B, batch bool) {
	inserts := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 200_000)
	updates, deletes := inserts/4, inserts/4
	total := inserts + updates + deletes
	srv := mysqltest.Shared(b)
	for range b.N {
		db, src, stateDB, from := srv.NewSource(b, "bench_e2e", "id INT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(64) NOT NULL")
		hook := newCountingHook(b, nil)
		file := &lineCounter{path: filepath.Join(b.TempDir(), "out.jsonl")}
		cfgPath := filepath.Join(b.TempDir(), "cdcout.yaml")
		yaml := fmt.Sprintf("sinks:\n  - name: hook\n    url: %s\n    http: {batch: %v}\n  - name: file\n    url: file://%s\n", hook.srv.URL, batch, file.path)
		if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
			b.Fatal(err)
		}
		p, _ := benchRun(b, srv, stateDB, "e2e", "--tables", src+".t", "--from", from, "--config", cfgPath)

		start := time.Now()
		db0, _ := srv.CPUTime()
		own0 := mysqltest.OwnCPUTime()
		const chunk = 1000
		for lo := 0; lo < inserts; lo += chunk {
			var q strings.Builder
			q.WriteString("INSERT INTO `" + src + "`.t VALUES ")
			for id := lo; id < min(lo+chunk, inserts); id++ {
				if id > lo {
					q.WriteByte(',')
				}
				fmt.Fprintf(&q, "(%d,0,'padpadpadpadpadpadpadpadpadpad')", id)
			}
			if _, err := db.Exec(q.String()); err != nil {
				b.Fatal(err)
			}
		}
		for lo := 0; lo < updates; lo += chunk {
			if _, err := db.Exec(fmt.Sprintf("UPDATE `%s`.t SET v = 1 WHERE id >= %d AND id < %d", src, lo, min(lo+chunk, updates))); err != nil {
				b.Fatal(err)
			}
		}
		for lo := updates; lo < updates+deletes; lo += chunk {
			if _, err := db.Exec(fmt.Sprintf("DELETE FROM `%s`.t WHERE id >= %d AND id < %d", src, lo, min(lo+chunk, updates+deletes))); err != nil {
				b.Fatal(err)
			}
		}
		writeDone := time.Since(start)
		var hookDone, fileDone time.Duration
		var hwm int64
		waitFor(b, 30*time.Minute, func() (bool, string) {
			if p.exited() {
				b.Fatalf("cdcout exited: %v", p.err)
			}
			hwm = max(hwm, peakRSS(p.cmd.Process.Pid))
			h, f := hook.distinct(), file.count()
			if hookDone == 0 && h >= total {
				hookDone = time.Since(start)
			}
			if fileDone == 0 && f >= total {
				fileDone = time.Since(start)
			}
			return h >= total && f >= total, fmt.Sprintf("hook %d, file %d of %d", h, f, total)
		})
		elapsed := time.Since(start)
		// CPU per change, which unlike changes/s does not depend on what
		// else runs on the machine: the database's (the writer's statements
		// included) and cdcout's.
		db1, dbOK := srv.CPUTime()
		cdcCPU, _ := mysqltest.ProcessCPUTime(p.cmd.Process.Pid)
		// The benchmark process: the webhook receiver, the writer's client
		// and the file sink's line counting.
		own := mysqltest.OwnCPUTime() - own0
		if code := p.stop(30 * time.Second); code != 0 {
			b.Fatalf("cdcout exit code %d after SIGTERM", code)
		}
		raw := srv.RawReadRate(b, src, from, total)
		b.ReportMetric(float64(own.Microseconds())/float64(total), "bench_cpu_us/change")
		if dbOK {
			b.ReportMetric(float64((db1-db0).Microseconds())/float64(total), "db_cpu_us/change")
		}
		b.ReportMetric(float64(cdcCPU.Microseconds())/float64(total), "cdcout_cpu_us/change")
		b.ReportMetric(float64(total)/elapsed.Seconds(), "changes/s")
		b.ReportMetric(raw, "raw_read_changes/s")
		b.ReportMetric(writeDone.Seconds(), "write_s")
		b.ReportMetric(hookDone.Seconds(), "http_done_s")
		b.ReportMetric(fileDone.Seconds(), "file_done_s")
		b.ReportMetric(float64(hwm)/(1<<20), "peak_rss_MB")
		b.Logf("%d changes (%d inserts, %d updates, %d deletes): committed in %s, all delivered to file %s and http %s after the first commit (%.0f changes/s); raw go-mysql read %.0f changes/s; %d http requests; peak RSS %.0f MB; CPU per change: database %.0f µs, cdcout %.0f µs",
			total, inserts, updates, deletes, writeDone.Round(time.Millisecond), fileDone.Round(time.Millisecond), hookDone.Round(time.Millisecond),
			float64(total)/elapsed.Seconds(), raw, hook.requests, float64(hwm)/(1<<20),
			float64((db1-db0).Microseconds())/float64(total), float64(cdcCPU.Microseconds())/float64(total))
	}
}

func BenchmarkLatency(b *testing.B) {
	seconds := mysqltest.BenchEnv("CDCOUT_BENCH_SECONDS", 15)
	const (
		rate  = 2000
		perTx = 10
		every = perTx * time.Second / rate // one 10-row transaction per 5ms
	)
	srv := mysqltest.Shared(b)
	for range b.N {
		db, src, stateDB, from := srv.NewSource(b, "bench_lat", "id INT PRIMARY KEY, v INT NOT NULL")
		n := rate * seconds
		committed := make([]atomic.Int64, n) // id → unix ns just before COMMIT was sent
		var (
			mu   sync.Mutex
			lats []time.Duration
		)
		hook := newCountingHook(b, func(body []byte, at time.Time) {
			var env struct {
				After struct {
					ID int `json:"id"`
				} `json:"after"`
			}
			if json.Unmarshal(body, &env) != nil || env.After.ID >= n {
				return
			}
			if c := committed[env.After.ID].Load(); c > 0 {
				mu.Lock()
				lats = append(lats, at.Sub(time.Unix(0, c)))
				mu.Unlock()
			}
		})
		file := filepath.Join(b.TempDir(), "out.jsonl")
		p, _ := benchRun(b, srv, stateDB, "lat", "--tables", src+".t", "--from", from,
			"--sink", "hook="+hook.srv.URL, "--sink", "file=file://"+file)

		start := time.Now()
		for lo := 0; lo < n; lo += perTx {
			// On a schedule, catching up when a statement was slow, so the
			// offered rate stays 2,000/s on average.
			time.Sleep(time.Until(start.Add(time.Duration(lo/perTx) * every)))
			var q strings.Builder
			q.WriteString("INSERT INTO `" + src + "`.t VALUES ")
			for id := lo; id < lo+perTx; id++ {
				if id > lo {
					q.WriteByte(',')
				}
				fmt.Fprintf(&q, "(%d,0)", id)
			}
			// Autocommit: the statement is the transaction; its send time
			// stands for the commit (conservative by the round trip).
			now := time.Now().UnixNano()
			for id := lo; id < lo+perTx; id++ {
				committed[id].Store(now)
			}
			if _, err := db.Exec(q.String()); err != nil {
				b.Fatal(err)
			}
		}
		achieved := float64(n) / time.Since(start).Seconds()
		waitFor(b, 5*time.Minute, func() (bool, string) {
			return hook.distinct() >= n, fmt.Sprintf("hook %d of %d", hook.distinct(), n)
		})
		hwm := peakRSS(p.cmd.Process.Pid)
		if code := p.stop(30 * time.Second); code != 0 {
			b.Fatalf("cdcout exit code %d after SIGTERM", code)
		}
		// Where the time goes: commit → record enqueued (its segment's
		// created_at, the database clock, the same machine's clock as ours).
		var enq []time.Duration
		for _, r := range enqueueTimes(b, db, stateDB, "hook") {
			if r.id < n {
				enq = append(enq, time.Duration(r.created*1e9-float64(committed[r.id].Load())))
			}
		}
		quantiles := func(d []time.Duration) (p50, p99, pmax time.Duration) {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			q := func(f float64) time.Duration { return d[min(len(d)-1, int(f*float64(len(d))))] }
			return q(0.50), q(0.99), d[len(d)-1]
		}
		e50, e99, _ := quantiles(enq)
		mu.Lock()
		p50, p99, pmax := quantiles(lats)
		mu.Unlock()
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
		b.ReportMetric(float64(pmax.Microseconds())/1000, "max_ms")
		b.ReportMetric(achieved, "offered_changes/s")
		b.ReportMetric(float64(e50.Microseconds())/1000, "enqueue_p50_ms")
		b.ReportMetric(float64(e99.Microseconds())/1000, "enqueue_p99_ms")
		b.Logf("%d changes at %.0f changes/s offered (%d-row transactions): commit→webhook p50 %s p99 %s max %s (of which commit→enqueued p50 %s p99 %s); peak RSS %.0f MB",
			n, achieved, perTx, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), pmax.Round(time.Millisecond),
			e50.Round(100*time.Microsecond), e99.Round(100*time.Microsecond), float64(hwm)/(1<<20))
	}
}

func BenchmarkHugeTransactionRSS(b *testing.B) {
	rows := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 1_000_000)
	if os.Getenv("CDCOUT_BENCH_ROWS") != "" {
		rows = max(rows*5, 1000) // 200k → 1M: same knob as the others
	}
	if v := mysqltest.BenchEnv("CDCOUT_BENCH_TX_ROWS", 0); v > 0 {
		rows = v
	}
	srv := mysqltest.Shared(b)
	for range b.N {
		db, src, stateDB, from := srv.NewSource(b, "bench_rss", "id INT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(64) NOT NULL")
		file := &lineCounter{path: filepath.Join(b.TempDir(), "out.jsonl")}
		p, _ := benchRun(b, srv, stateDB, "rss", "--tables", src+".t", "--from", from, "--sink", "file=file://"+file.path)
		base := peakRSS(p.cmd.Process.Pid)

		start := time.Now()
		// One statement, one transaction of `rows` row images.
		if _, err := db.Exec(fmt.Sprintf("INSERT INTO `%s`.t SELECT seq, seq, 'padpadpadpadpadpadpadpadpadpad' FROM %s", src, mysqltest.Seq(rows))); err != nil {
			b.Fatal(err)
		}
		committed := time.Since(start)
		var hwm int64
		waitFor(b, 60*time.Minute, func() (bool, string) {
			if p.exited() {
				b.Fatalf("cdcout exited: %v", p.err)
			}
			hwm = max(hwm, peakRSS(p.cmd.Process.Pid))
			f := file.count()
			return f >= rows, fmt.Sprintf("file %d of %d", f, rows)
		})
		elapsed := time.Since(start)
		if code := p.stop(30 * time.Second); code != 0 {
			b.Fatalf("cdcout exit code %d after SIGTERM", code)
		}
		b.ReportMetric(float64(hwm)/(1<<20), "peak_rss_MB")
		b.ReportMetric(float64(rows)/elapsed.Seconds(), "changes/s")
		b.Logf("one %d-row transaction: committed in %s, in the file after %s (%.0f changes/s); cdcout peak RSS %.0f MB (%.0f MB before the transaction)",
			rows, committed.Round(time.Millisecond), elapsed.Round(time.Millisecond), float64(rows)/elapsed.Seconds(), float64(hwm)/(1<<20), float64(base)/(1<<20))
	}
}

// enqueued is when the change of the source row id was enqueued, in Unix
// seconds.
type enqueued struct {
	id      int
	created float64
}

// enqueueTimes returns when each record of the sink was enqueued: the
// created_at of the segment it was written in, also for a record that left
// its segment as an outbox row since.
func enqueueTimes(b *testing.B, db *sql.DB, stateDB, sink string) []enqueued {
	b.Helper()
	type segment struct {
		id, last string
		created  float64
	}
	segs := map[string][]segment{} // pipe → its segments in id order
	rows, err := db.Query("SELECT pipe, id, last_id, UNIX_TIMESTAMP(created_at) FROM `"+stateDB+"`.segments WHERE sink = ? ORDER BY pipe, id", sink)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var pipe string
		var s segment
		if err := rows.Scan(&pipe, &s.id, &s.last, &s.created); err != nil {
			b.Fatal(err)
		}
		segs[pipe] = append(segs[pipe], s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	recs, err := outbox.ReadRecords(context.Background(), db, stateDB, "%")
	if err != nil {
		b.Fatal(err)
	}
	var out []enqueued
	for _, r := range recs {
		if r.Sink != sink {
			continue
		}
		ss := segs[r.Pipe]
		i := sort.Search(len(ss), func(i int) bool { return ss[i].id > r.ID }) - 1
		if i < 0 || r.ID > ss[i].last {
			b.Fatalf("record %s of %s is in no segment", r.ID, r.Pipe)
		}
		var env struct {
			After struct {
				ID int `json:"id"`
			} `json:"after"`
		}
		if err := json.Unmarshal(r.Payload, &env); err != nil {
			b.Fatalf("record %s: %v", r.ID, err)
		}
		out = append(out, enqueued{env.After.ID, ss[i].created})
	}
	return out
}
