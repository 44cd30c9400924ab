package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// Delivery against receivers of little capacity (issue 12): `cdcout run`
// with its defaults, a few thousand changes in small transactions, and a
// receiver that can take little. Each test measures the receiver's
// capacity itself (measureCapacity) and asserts that every change arrives
// in per-key order, nothing is dead-lettered, no attempt is counted for
// overload, and the delivery takes at most 1.5× what the receiver's
// capacity (measured alone before and after) allows.
//
// CDCOUT_CAPACITY_CHANGES sets the number of changes (the figure
// is 4,000); by default each test sizes it to about 8 s of the receiver's
// capacity (at least 200, at most 4,000), so CI stays short.

// capacityReceiver is one receiver under test.
type capacityReceiver struct {
	url string
	// accepted returns the deliveries in arrival order (Python's log has
	// only accepted ones; the Go receivers record every answer).
	arrivals func() []delivery
	// refuses is how long the receiver refuses on purpose ((c)'s 503s),
	// added to the time its capacity allows.
	refuses time.Duration
}

// TestSmallReceiverThreadingHTTPServer is (a): Python's
// http.server.ThreadingHTTPServer, unmodified (listen backlog 5, a thread
// per connection, HTTP/1.0: a connection per request), with a handler
// that logs each body. Without python3 on PATH a Go listener with backlog
// 5 serving 2 requests at a time stands in.
func TestSmallReceiverThreadingHTTPServer(t *testing.T) {
	name, rc := threadingReceiver(t)
	runCapacity(t, name, rc, 0)
}

func threadingReceiver(t testing.TB) (string, *capacityReceiver) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Log("python3 not on PATH: a Go listener with backlog 5 serving 2 at a time stands in")
		r := newSmallReceiver(t, 5, 2, func(*envelope) (int, time.Duration) { return 200, 0 })
		return "threading-go", &capacityReceiver{url: r.srv.URL, arrivals: r.snapshot}
	}
	rc := startPythonReceiver(t, py)
	// Python's server is CPU-bound and shares the 2 CPUs with cdcout and
	// the database; its capacity is measured alone, before and after the
	// delivery, so the bound is fair only when nothing else runs: beside
	// other sessions' builds and tests (load average 2–10) 14 runs came to
	// 0.59–1.23 of that capacity, with the endpoint's limit in use almost
	// all along (slots unused for 11–41 ms of 2.5–3.3 s in the three runs
	// traced) — the receiver got less of the CPUs while cdcout delivered.
	// `make test` runs the capacity tests after the rest, alone
	// (CAPACITY_TESTS in the Makefile), and holds them to the 1.5×.
	return "threading-python", rc
}

// TestSingleThreadedSlowReceiver is (b): one request at a time, 50 ms
// each (20 requests/s).
func TestSingleThreadedSlowReceiver(t *testing.T) {
	runCapacity(t, "single-50ms", singleThreadedReceiver(t), 0)
}

func singleThreadedReceiver(t testing.TB) *capacityReceiver {
	r := newSmallReceiver(t, 128, 1, func(*envelope) (int, time.Duration) { return 200, 50 * time.Millisecond })
	return &capacityReceiver{url: r.srv.URL, arrivals: r.snapshot}
}

// TestRetryAfterReceiver is (c): 503 with Retry-After: 5 for the first
// 10 s of deliveries, then 200.
func TestRetryAfterReceiver(t *testing.T) {
	runCapacity(t, "retry-after", retryAfterReceiver(t), 0)
}

// BenchmarkLimitedReceivers runs (a), (b) and (c) at the size,
// 4,000 changes each (CDCOUT_CAPACITY_CHANGES overrides), and reports the
// delivered rate as a fraction of the receiver's measured capacity
// (target ≥ 0.8; (c)'s 10 s of refusals left out).
func BenchmarkLimitedReceivers(b *testing.B) {
	for _, tc := range []struct {
		name string
		rc   func(testing.TB) (string, *capacityReceiver)
	}{
		{"threading", threadingReceiver},
		{"single-50ms", func(t testing.TB) (string, *capacityReceiver) { return "single-50ms", singleThreadedReceiver(t) }},
		{"retry-after", func(t testing.TB) (string, *capacityReceiver) { return "retry-after", retryAfterReceiver(t) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				name, rc := tc.rc(b)
				res := runCapacity(b, name, rc, 4000)
				b.ReportMetric(res.fraction, "of_capacity")
				b.ReportMetric(res.capacity, "capacity_req/s")
				b.ReportMetric(res.window.Seconds(), "delivery_s")
				b.ReportMetric(float64(res.changes), "changes")
			}
		})
	}
}

func retryAfterReceiver(t testing.TB) *capacityReceiver {
	var (
		mu    sync.Mutex
		first time.Time
	)
	r := newReceiver(t, func(env *envelope) (int, time.Duration) {
		if env == nil {
			return 200, 0 // capacity probe: the 200 phase
		}
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) < 10*time.Second {
			return http.StatusServiceUnavailable, 0
		}
		return 200, 0
	})
	r.retryAfter = "5"
	return &capacityReceiver{url: r.srv.URL, arrivals: r.snapshot, refuses: 10 * time.Second}
}

// startPythonReceiver runs Python's ThreadingHTTPServer with a handler
// that appends "<unix time> <body>" per delivery to a file before
// answering 200 (so a key's deliveries are logged in the order cdcout
// sent them: the next waits for this answer).
func startPythonReceiver(t testing.TB, py string) *capacityReceiver {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "receiver.py")
	logPath := filepath.Join(dir, "deliveries.log")
	const src = `import http.server, sys, threading, time
lock = threading.Lock()
out = open(sys.argv[1], "ab")

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("webhook-id"):
            with lock:
                out.write(b"%.6f " % time.time() + body.replace(b"\n", b" ") + b"\n")
                out.flush()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(srv.server_address[1], flush=True)
srv.serve_forever()
`
	if err := os.WriteFile(script, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script, logPath)
	cmd.Stderr = io.Discard // the server's request log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	port, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("python receiver did not print its port: %v", err)
	}
	// The log is read on from where the last call stopped: the test polls
	// it while cdcout delivers, and parsing it whole each time took CPU
	// from the receiver it measures.
	var (
		mu     sync.Mutex
		offset int64
		out    []delivery
	)
	arrivals := func() []delivery {
		mu.Lock()
		defer mu.Unlock()
		f, err := os.Open(logPath)
		if err != nil {
			return slices.Clone(out)
		}
		defer f.Close()
		b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<40))
		if err != nil {
			return slices.Clone(out)
		}
		if end := bytes.LastIndexByte(b, '\n'); end >= 0 {
			b = b[:end+1] // the last, maybe partly written line waits
		} else {
			b = nil
		}
		offset += int64(len(b))
		for _, line := range bytes.Split(b, []byte("\n")) {
			ts, body, ok := bytes.Cut(line, []byte(" "))
			if !ok {
				continue
			}
			sec, err := strconv.ParseFloat(string(ts), 64)
			env, perr := parseEnvelope(body)
			if err != nil || perr != nil {
				continue
			}
			out = append(out, delivery{webhookID: env.ID, env: env, status: 200,
				at: time.Unix(0, int64(sec*1e9))})
		}
		return slices.Clone(out)
	}
	return &capacityReceiver{url: "http://127.0.0.1:" + strings.TrimSpace(port), arrivals: arrivals}
}

// measureCapacity is the receiver's capacity in requests per second: the
// best of 1, 2, 4 and 8 clients posting body back to back for a second
// each, with the headers cdcout sends (a receiver parses them) and
// X-Capacity-Probe (the Go receivers do not record these; Python's logs
// them like deliveries, at the same cost, and the test skips them).
func measureCapacity(t testing.TB, url string, body []byte) float64 {
	t.Helper()
	best := 0.0
	for _, conc := range []int{1, 2, 4, 8} {
		stop := make(chan struct{})
		start := time.Now()
		time.AfterFunc(time.Second, func() { close(stop) })
		n := probeReceiver(url, body, conc, stop)
		best = max(best, float64(n)/time.Since(start).Seconds())
	}
	if best == 0 {
		t.Fatal("the receiver answered no capacity probe")
	}
	return best
}

// probeReceiver posts body to url from conc clients back to back until
// stop is closed (see measureCapacity) and returns the number of 2xx
// answers.
func probeReceiver(url string, body []byte, conc int, stop <-chan struct{}) int {
	// A connect dropped from a full accept queue (Python's backlog is 5)
	// is tried again after 50 ms, as cdcout does, not after the kernel's
	// one-second SYN retransmit: the probe measures the receiver, not the
	// retransmit timer.
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DialContext: (&net.Dialer{Timeout: 50 * time.Millisecond}).DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, url+"/hook", bytes.NewReader(body))
				for _, h := range []string{"Ce-Specversion", "Ce-Id", "Ce-Source", "Ce-Type", "Ce-Subject", "Ce-Time", "Webhook-Id", "Webhook-Timestamp"} {
					req.Header[h] = []string{"0192f0c1-aaaa-7bbb-8ccc-123456789012"}
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Capacity-Probe", "1")
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(n.Load())
}

// capacityResult is what runCapacity measured.
type capacityResult struct {
	changes  int
	capacity float64 // requests/s
	window   time.Duration
	// fraction is the delivered rate over the capacity (refusal time left
	// out).
	fraction float64
}

// runCapacity writes changes in small transactions, delivers them with
// `cdcout run` at its defaults to rc and checks the outcome (see the top
// of the file).
func runCapacity(t testing.TB, name string, rc *capacityReceiver, n int) capacityResult {
	t.Helper()
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "e2e_cap")
	stateDB := srv.CreateDB(t, "e2e_cap_state")
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(64) NOT NULL)")
	db := srv.Open(t)

	// Shaped like a delivery but without a GTID: parseEnvelope skips it.
	probe := []byte(`{"id":"probe","op":"u","key":{"id":1},"before":{"id":1,"v":1,"note":"` + strings.Repeat("x", 40) +
		`"},"after":{"id":1,"v":2,"note":"` + strings.Repeat("y", 40) + `"},"source":{"db":"d","table":"t","row":0}}`)
	capacity := measureCapacity(t, rc.url, probe)
	if n <= 0 {
		n = min(4000, max(200, int(capacity*8)))
	}
	n = mysqltest.BenchEnv("CDCOUT_CAPACITY_CHANGES", n)
	from := gtidPos(t, db)
	writeSmallTxns(t, db, src, n)

	inspectAddr := mysqltest.FreeAddr(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cdcout.yaml")
	cfg := fmt.Sprintf("instance: cap\nhttp_addr: %q\nsinks:\n  - name: hook\n    url: %s/hook\n", inspectAddr, rc.url)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log := newLogFile(t, "capacity-"+name)
	p := startCdcout(t, log, "run", "--config", cfgPath, "--dsn", srv.DSN, "--state-db", stateDB,
		"--tables", src+".t", "--from", from, "--log-format", "json")
	defer p.kill()

	expected := rc.refuses + time.Duration(float64(n)/capacity*float64(time.Second))
	accepted := func() (map[string]bool, []envelope, time.Time, time.Time) {
		ids := map[string]bool{}
		var envs []envelope
		var first, last time.Time
		for _, d := range rc.arrivals() {
			if first.IsZero() {
				first = d.at
			}
			if d.status != 200 || ids[d.webhookID] {
				continue
			}
			ids[d.webhookID] = true
			envs = append(envs, d.env)
			last = d.at
		}
		return ids, envs, first, last
	}
	timeout := 3*expected + 60*time.Second
	deadline := time.Now().Add(timeout)
	waitFor(t, timeout, func() (bool, string) {
		if p.exited() {
			t.Fatalf("cdcout exited: %v\n%s", p.err, log.tail(20))
		}
		ids, _, _, _ := accepted()
		if len(ids) == n {
			return true, ""
		}
		what := fmt.Sprintf("%d of %d changes arrived", len(ids), n)
		if time.Until(deadline) < 2*time.Second {
			// Read only for the failure message: a query per poll is
			// database CPU the receiver's share would pay for.
			what += "; outbox: " + outboxSummary(db, stateDB)
		}
		return false, what
	})
	ids, envs, first, last := accepted()
	res := capacityResult{changes: n, window: last.Sub(first)}
	endpoint := sinksEndpoint(t, inspectAddr)
	// The machine is shared: the capacity is measured again after the
	// delivery, and the mean of the two is what the delivery is held to.
	after := measureCapacity(t, rc.url, probe)
	res.capacity = (capacity + after) / 2
	if code := p.stop(20 * time.Second); code != 0 {
		t.Errorf("cdcout exited with code %d after SIGTERM", code)
	}
	if len(ids) != n {
		t.Fatalf("%d distinct changes arrived, want %d", len(ids), n)
	}
	for _, v := range orderViolations(envs) {
		t.Errorf("per-key order: %s", v)
	}
	checkNoAttempts(t, db, stateDB)
	if n := log.count(`"delivery failed`); n > 0 && rc.refuses == 0 {
		t.Errorf("%d delivery-failed lines against a receiver that never fails", n)
	}

	expected = rc.refuses + time.Duration(float64(n)/res.capacity*float64(time.Second))
	if d := res.window - rc.refuses; d > 0 {
		res.fraction = float64(n) / d.Seconds() / res.capacity
	}
	t.Logf("%s: %d changes, receiver capacity %.0f requests/s, delivered in %s (capacity allows %s): %.2f of capacity; endpoint at the end: %s",
		name, n, res.capacity, res.window.Round(time.Millisecond), expected.Round(time.Millisecond), res.fraction, endpoint)
	const bound = 1.5 // the issue's
	if limit := time.Duration(bound * float64(expected)); res.window > limit {
		t.Errorf("delivery took %s, more than %.1f× the %s the receiver's capacity allows", res.window.Round(time.Millisecond), bound, expected.Round(time.Millisecond))
	}
	return res
}

// writeSmallTxns writes n row changes in transactions of 1–4: 100 keys
// inserted, then updated round-robin, so every key has a history to keep
// in order.
func writeSmallTxns(t testing.TB, db *sql.DB, src string, n int) {
	t.Helper()
	const keys = 100
	written := 0
	for tx := 0; written < n; tx++ {
		size := min(1+tx%4, n-written)
		txn, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for range size {
			k := written%keys + 1
			q := fmt.Sprintf("UPDATE `%s`.t SET v = v + 1, note = 'u%d' WHERE id = %d", src, written, k)
			if written < keys {
				q = fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d, 0, 'n')", src, k)
			}
			if _, err := txn.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			written++
		}
		if err := txn.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkNoAttempts fails the test when a record was dead-lettered or an
// attempt counted beyond the one that delivered it (overload is not an
// attempt).
func checkNoAttempts(t testing.TB, db *sql.DB, stateDB string) {
	t.Helper()
	var dead, rowsMaxAttempts, segMaxAttempts, logged int
	q := "`" + stateDB + "`."
	if err := db.QueryRow("SELECT (SELECT COUNT(*) FROM "+q+"outbox WHERE status = 'dead'),"+
		" (SELECT COALESCE(MAX(attempts), 0) FROM "+q+"outbox),"+
		" (SELECT COALESCE(MAX(attempts), 0) FROM "+q+"segments),"+
		" (SELECT COUNT(*) FROM "+q+"attempts)").Scan(&dead, &rowsMaxAttempts, &segMaxAttempts, &logged); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d records dead-lettered, want none", dead)
	}
	if rowsMaxAttempts > 1 || segMaxAttempts > 1 || logged != 0 {
		t.Errorf("attempts counted: max %d on outbox rows, %d on segments, %d failed attempts logged; want one attempt each, none failed",
			rowsMaxAttempts, segMaxAttempts, logged)
	}
}

// sinksEndpoint returns the endpoint block of /v1/sinks (the webhook's
// adaptive concurrency), failing when it is missing.
func sinksEndpoint(t testing.TB, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/sinks", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/sinks: %v", err)
	}
	defer resp.Body.Close()
	var v struct {
		Pipes []struct {
			Endpoint *struct {
				Limit    int     `json:"limit"`
				Max      int     `json:"max"`
				InFlight int     `json:"inFlight"`
				RTTMs    float64 `json:"rttMs"`
				FloorMs  float64 `json:"rttFloorMs"`
				Over     int64   `json:"overloads"`
			} `json:"endpoint"`
		} `json:"pipes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("decode /v1/sinks: %v", err)
	}
	for _, p := range v.Pipes {
		if e := p.Endpoint; e != nil {
			if e.Limit < 1 || e.Max < e.Limit {
				t.Errorf("/v1/sinks endpoint: %+v, want 1 ≤ limit ≤ max", *e)
			}
			return fmt.Sprintf("limit %d of %d, %d in flight, rtt %.1f ms, floor %.1f ms, %d overload answers", e.Limit, e.Max, e.InFlight, e.RTTMs, e.FloorMs, e.Over)
		}
	}
	t.Errorf("/v1/sinks has no endpoint block: %+v", v)
	return ""
}
