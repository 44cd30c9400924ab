package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/outbox"
)

// proc is one running cdcout child process.
type proc struct {
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	err     error // cmd.Wait's result, set before done closes
}

// logFile collects the output of every process a test starts, so a failure
// can show the children's last lines.
type logFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func newLogFile(t testing.TB, name string) *logFile {
	t.Helper()
	dir := t.TempDir()
	// CDCOUT_TEST_LOGS keeps the logs in a directory of one's own, to read
	// after the run (they are otherwise removed with the test's temp dir).
	if keep := os.Getenv("CDCOUT_TEST_LOGS"); keep != "" {
		if err := os.MkdirAll(keep, 0o755); err != nil {
			t.Fatal(err)
		}
		dir = keep
		name += "-" + time.Now().UTC().Format("150405.000")
	}
	path := dir + "/" + name + ".log"
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	l := &logFile{path: path, f: f}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of the cdcout logs (%s):\n%s", path, l.tail(80))
		}
		f.Close()
	})
	return l
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

func (l *logFile) tail(n int) string {
	b, err := os.ReadFile(l.path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// count returns how many log lines contain s.
func (l *logFile) count(s string) int {
	b, err := os.ReadFile(l.path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte(s))
}

// startCdcout starts the binary with args; its output goes to log. The
// process is SIGKILLed at the end of the test if still running.
func startCdcout(t testing.TB, log *logFile, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	// CDCOUT_BENCH_CHILD_CGROUP names a cgroup directory the binary runs
	// in (a memory limit of its own, say): the shell joins it, then
	// becomes the binary, keeping its pid.
	if dir := os.Getenv("CDCOUT_BENCH_CHILD_CGROUP"); dir != "" {
		cmd = exec.Command("sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir, binPath}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	// CDCOUT_BENCH_CHILD_GOMAXPROCS sets GOMAXPROCS for the binary alone,
	// so a benchmark can compare it without the test process's own bare
	// read and in-process brokers running under it too.
	if v := os.Getenv("CDCOUT_BENCH_CHILD_GOMAXPROCS"); v != "" {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+v)
	}
	fmt.Fprintf(log, "==== %s cdcout %s\n", time.Now().UTC().Format(time.RFC3339Nano), args[0])
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cdcout: %v", err)
	}
	p := &proc{cmd: cmd, started: time.Now(), done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and returns the exit code, or -1 if the process did
// not exit within grace (it is then killed).
func (p *proc) stop(grace time.Duration) int {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(grace):
		p.kill()
		return -1
	}
}

// runCdcout runs a short cdcout command (dead list, tail) to completion and
// returns its stdout.
func runCdcout(t testing.TB, timeout time.Duration, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cdcout %s: %v\n%s", strings.Join(args[:min(2, len(args))], " "), err, stderr.String())
	}
	return out
}

// envelope is the part of a change envelope the tests look at.
type envelope struct {
	ID        string          `json:"id"`
	ChangeKey string          `json:"change_key"`
	Op        string          `json:"op"`
	Key       json.RawMessage `json:"key"`
	Source    struct {
		DB    string `json:"db"`
		Table string `json:"table"`
		GTID  string `json:"gtid"`
		Row   int    `json:"row"`
	} `json:"source"`
}

// change identifies a source change independently of the identity mode:
// the table, the transaction's GTID and the row image's ordinal in it.
type change struct {
	table string
	gtid  string
	row   int
}

func (e *envelope) change() change {
	return change{table: e.Source.Table, gtid: e.Source.GTID, row: e.Source.Row}
}

// rowKey is the key per-key order is about: table and canonical key JSON.
func (e *envelope) rowKey() string { return e.Source.Table + " " + string(e.Key) }

// pos orders changes in commit order: the GTID's sequence number (one
// source server, one domain) and the row ordinal inside the transaction.
func (e *envelope) pos() [2]uint64 {
	// The sequence number ends the GTID in both notations: MariaDB's
	// domain-server-seq, MySQL's uuid[:tag]:seq (one source here).
	i := strings.LastIndexAny(e.Source.GTID, "-:")
	seq, _ := strconv.ParseUint(e.Source.GTID[i+1:], 10, 64)
	return [2]uint64{seq, uint64(e.Source.Row)}
}

func parseEnvelope(b []byte) (envelope, error) {
	var e envelope
	if err := json.Unmarshal(b, &e); err != nil {
		return e, err
	}
	if e.Source.GTID == "" || e.ID == "" {
		return e, fmt.Errorf("envelope without gtid or id: %.200s", b)
	}
	return e, nil
}

// delivery is one request the receiver got.
type delivery struct {
	webhookID string
	env       envelope
	at        time.Time
	status    int
}

// receiver is an httptest webhook endpoint recording every request in
// arrival order. answer decides the status and how long to wait first.
type receiver struct {
	srv    *httptest.Server
	answer func(env *envelope) (status int, delay time.Duration)
	// retryAfter, when set, is sent with every 503.
	retryAfter string
	// slots, when set, bounds the requests served at once (a receiver of
	// small capacity); the answer's delay is spent holding a slot.
	slots chan struct{}

	mu         sync.Mutex
	deliveries []delivery
	bad        []string
}

func newReceiver(t testing.TB, answer func(env *envelope) (int, time.Duration)) *receiver {
	r := &receiver{answer: answer}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// newSmallReceiver is newReceiver with little capacity, like the first
// receiver many people write (Python's http.server.ThreadingHTTPServer):
// a listen backlog of backlog connections and at most concurrent requests
// served at once.
func newSmallReceiver(t testing.TB, backlog, concurrent int, answer func(env *envelope) (int, time.Duration)) *receiver {
	t.Helper()
	ln, err := sinktest.ListenBacklog(backlog)
	if err != nil {
		t.Fatalf("listen with backlog %d: %v", backlog, err)
	}
	r := &receiver{answer: answer, slots: make(chan struct{}, concurrent)}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	r.srv.Listener.Close()
	r.srv.Listener = ln
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if r.slots != nil {
		select {
		case r.slots <- struct{}{}:
		case <-req.Context().Done():
			return
		}
		defer func() { <-r.slots }()
	}
	body, err := io.ReadAll(req.Body)
	at := time.Now()
	if req.Header.Get("X-Capacity-Probe") != "" {
		// A capacity probe (measureCapacity): served like a delivery,
		// not recorded.
		status, delay := r.answer(nil)
		if delay > 0 {
			time.Sleep(delay)
		}
		w.WriteHeader(status)
		return
	}
	env, perr := parseEnvelope(body)
	if err != nil || perr != nil {
		r.mu.Lock()
		r.bad = append(r.bad, fmt.Sprintf("read %v parse %v: %.200s", err, perr, body))
		r.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	// Recorded on arrival, so the slice is in arrival order even when
	// answers are slow.
	r.mu.Lock()
	i := len(r.deliveries)
	r.deliveries = append(r.deliveries, delivery{webhookID: req.Header.Get("webhook-id"), env: env, at: at})
	r.mu.Unlock()
	status, delay := r.answer(&env)
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
		}
	}
	r.mu.Lock()
	r.deliveries[i].status = status
	r.mu.Unlock()
	if status == http.StatusServiceUnavailable && r.retryAfter != "" {
		w.Header().Set("Retry-After", r.retryAfter)
	}
	w.WriteHeader(status)
}

func (r *receiver) snapshot() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.deliveries...)
}

// firstAfter returns the arrival time of the first request that arrived
// after t, if any.
func (r *receiver) firstAfter(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.deliveries) - 1; i >= 0; i-- {
		if !r.deliveries[i].at.After(t) {
			if i+1 < len(r.deliveries) {
				return r.deliveries[i+1].at, true
			}
			return time.Time{}, false
		}
	}
	if len(r.deliveries) > 0 {
		return r.deliveries[0].at, true
	}
	return time.Time{}, false
}

// orderViolations checks per-key order over envelopes in arrival order:
// after dropping redeliveries (an id seen before), each key's positions
// must strictly increase. It returns descriptions of the first violations.
func orderViolations(envs []envelope) []string {
	seen := map[string]bool{}
	last := map[string][2]uint64{}
	var out []string
	for _, e := range envs {
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		k := e.rowKey()
		p := e.pos()
		if l, ok := last[k]; ok && !(p[0] > l[0] || p[0] == l[0] && p[1] > l[1]) {
			if len(out) < 5 {
				out = append(out, fmt.Sprintf("key %s: %s row %d (id %s) after position %v", k, e.Source.GTID, e.Source.Row, e.ID, l))
			}
			continue
		}
		last[k] = p
	}
	return out
}

// outboxRow is one record of the state database's outbox: a row of the
// outbox table or a record still inside its segment.
type outboxRow struct {
	id, pipe, changeKey string
	status              outbox.Status
	env                 envelope
	segment             string // the segment holding it, "" for a row
}

// readOutbox returns every record enqueued, each once, as
// outbox.ReadRecords reads them.
func readOutbox(t testing.TB, db *sql.DB, stateDB string) []outboxRow {
	t.Helper()
	recs, err := outbox.ReadRecords(context.Background(), db, stateDB, "%")
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	out := make([]outboxRow, 0, len(recs))
	for _, rec := range recs {
		r := outboxRow{id: rec.ID, pipe: rec.Pipe, changeKey: rec.ChangeKey, status: rec.Status, segment: rec.InSegment}
		if r.env, err = parseEnvelope(rec.Payload); err != nil {
			t.Fatalf("outbox record %s: %v", r.id, err)
		}
		out = append(out, r)
	}
	return out
}

// outboxCounts counts the outbox's records, and of them those pending and
// those dead, in SQL: cheap enough to poll while tens of thousands of
// records are enqueued, where readOutbox decodes every segment. Every
// outbox row left a segment and is still counted in its segment's
// records; a pending segment's records are all pending (a record leaves
// its segment only when the segment is done).
func outboxCounts(db *sql.DB, stateDB string) (records, pending, dead int, err error) {
	q := "`" + stateDB + "`."
	err = db.QueryRow("SELECT (SELECT COALESCE(SUM(records), 0) FROM "+q+"segments),"+
		" (SELECT COALESCE(SUM(records), 0) FROM "+q+"segments WHERE status = 'pending')"+
		" + (SELECT COUNT(*) FROM "+q+"outbox WHERE status = 'pending'),"+
		" (SELECT COUNT(*) FROM "+q+"outbox WHERE status = 'dead')").Scan(&records, &pending, &dead)
	return records, pending, dead, err
}

// readJSONL parses a file sink's output. Lines that do not parse are
// returned separately (a torn last line after a crash is allowed by the
// file sink's contract, and is redelivered).
func readJSONL(t testing.TB, path string) (envs []envelope, bad []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("read file sink: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		e, err := parseEnvelope(sc.Bytes())
		if err != nil {
			bad = append(bad, sc.Text())
			continue
		}
		envs = append(envs, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return envs, bad
}

// tailChanges reads the source's binlog with a separate, plain `cdcout
// tail` from the given GTID position until it has n changes, and returns
// them. It is the independent account of what was committed.
func tailChanges(t testing.TB, dsn, tables, from string, n int) []envelope {
	t.Helper()
	out := runCdcout(t, 90*time.Second, "tail", "--dsn", dsn, "--tables", tables, "--from", from,
		"--limit", strconv.Itoa(n), "--log-format", "json", "--log-level", "warn")
	var envs []envelope
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var e envelope
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("tail printed a line that is not an envelope: %.200s", line)
		}
		envs = append(envs, e)
	}
	return envs
}

// waitFor polls cond until it reports done or timeout passes; what is
// cond's description of the state, shown on timeout.
func waitFor(t testing.TB, timeout time.Duration, cond func() (done bool, what string)) {
	t.Helper()
	wait.For(t, timeout, cond)
}

func gtidPos(t testing.TB, db *sql.DB) string {
	t.Helper()
	return mysqltest.GTIDPos(t, db)
}

// outboxSummary describes the outbox's undelivered records per pipe:
// pending segments (their records) and pending and dead rows, for timeout
// messages.
func outboxSummary(db *sql.DB, stateDB string) string {
	rows, err := db.Query("SELECT 'segments', pipe, status, SUM(records), MAX(attempts), COALESCE(MIN(next_attempt_at), ''), MAX(claimer) FROM `" + stateDB + "`.segments" +
		" WHERE status = 'pending' GROUP BY pipe, status" +
		" UNION ALL SELECT 'rows', pipe, status, COUNT(*), MAX(attempts), COALESCE(MIN(next_attempt_at), ''), MAX(claimer) FROM `" + stateDB + "`.outbox" +
		" WHERE status IN ('pending','dead') GROUP BY pipe, status")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var in, pipe, status, next, by string
		var n, att int
		if err := rows.Scan(&in, &pipe, &status, &n, &att, &next, &by); err != nil {
			return err.Error()
		}
		parts = append(parts, fmt.Sprintf("%s %s=%d in %s (max attempts %d, next %s, by %s)", pipe, status, n, in, att, next, by))
	}
	return strings.Join(parts, "; ")
}

// inBothModes runs test as a subtest of t once in each change identity
// mode (change_identity: gtid and digest), named after the mode.
func inBothModes(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range []string{"gtid", "digest"} {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}
