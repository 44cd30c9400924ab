package command

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// statusFixture fills a state database for instance "shop" (and one row of
// instance "other", which status must not show).
func statusFixture(t *testing.T) (dsn, schema string) {
	t.Helper()
	srv := mysqltest.Shared(t)
	schema = srv.CreateDB(t, "status")
	db := srv.Open(t)
	ctx := context.Background()
	if err := state.Migrate(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	q := "`" + schema + "`."
	srv.Exec(t,
		"INSERT INTO "+q+"outbox (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, status, attempts, last_error, last_error_at, commit_ts, created_at, payload) VALUES "+
			"('0190a000-0000-7000-8000-000000000001', 'shop:app.orders:hook', 'hook', 'g:1', 'app', 'orders', 'c', '1', SHA2('1',256), 'pending', 2, 'HTTP 503 from receiver', NOW(6) - INTERVAL 1 SECOND, NOW(6) - INTERVAL 12 SECOND, NOW(6) - INTERVAL 10 SECOND, '{}'),"+
			"('0190a000-0000-7000-8000-000000000002', 'shop:app.orders:hook', 'hook', 'g:2', 'app', 'orders', 'u', '1', SHA2('1',256), 'delivered', 1, NULL, NULL, NOW(6), NOW(6), '{}'),"+
			"('0190a000-0000-7000-8000-000000000003', 'shop:app.orders:hook', 'hook', 'g:3', 'app', 'orders', 'd', '2', SHA2('2',256), 'dead', 10, 'HTTP 400: bad payload', NOW(6), NOW(6), NOW(6), '{}'),"+
			"('0190a000-0000-7000-8000-000000000004', 'other:app.orders:hook', 'hook', 'g:4', 'app', 'orders', 'c', '3', SHA2('3',256), 'pending', 0, NULL, NULL, NOW(6), NOW(6), '{}')",
		"INSERT INTO "+q+"leases (name, holder, epoch, expires_at) VALUES "+
			"('enqueue/shop', 'r1/aa', 2, NOW(6) + INTERVAL 30 SECOND), ('drain/shop:app.orders:hook', 'r2/bb', 5, NOW(6) + INTERVAL 30 SECOND),"+
			"('enqueue/other', 'rx/cc', 1, NOW(6) + INTERVAL 30 SECOND)",
		"INSERT INTO "+q+"checkpoints (source, position, epoch, holder, updated_at) VALUES "+
			"('enqueue/shop', '{\"flavor\":\"mariadb\",\"gtid_set\":\"0-1-77\"}', 2, 'r1/aa', NOW(6))")
	for _, o := range []fleet.Observation{
		{ReplicaID: "r1", Kind: fleet.KindEngine, Version: "v2", Payload: inspect.EngineInfo{Instance: "shop", Role: "leader", ReadsSegmentFormat: 2, SegmentFormat: 1}},
		{ReplicaID: "r3", Kind: fleet.KindEngine, Version: "v1", Payload: inspect.EngineInfo{Instance: "shop", Role: "standby"}},
	} {
		if err := fleet.Write(ctx, db, schema, o); err != nil {
			t.Fatal(err)
		}
	}
	srv.Exec(t, "UPDATE "+q+"replicas SET written_at = NOW(6) - INTERVAL 150 SECOND WHERE replica_id = 'r3'")
	return srv.DSN, schema
}

func TestStatus(t *testing.T) {
	dsn, schema := statusFixture(t)

	t.Run("table", func(t *testing.T) {
		code, out, errOut := runCmd(t, "status", "--dsn", dsn, "--state-db", schema, "--instance", "shop")
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		for _, want := range []string{
			"instance shop",
			`checkpoint {"flavor":"mariadb","gtid_set":"0-1-77"}  epoch 2  holder r1/aa`,
			"PIPE                  PENDING  DELIVERING  DELIVERED  DEAD",
			"shop:app.orders:hook  1        0           1          1",
			"r2/bb", "HTTP 400: bad payload (",
			"enqueue/shop", "drain/shop:app.orders:hook",
			// r1 wrote; r2 holds a lease but wrote nothing; r3 is stale.
			"FLEET 1/3 responded; missing: r2; stale: r3 (2m30s old); mixed versions: v1×1, v2×1",
			// r1 writes format 1 because r3, of an older release, says
			// nothing of formats.
			"SEGMENT FORMAT", "leader   reads 2, writes 1", "standby  reads 1 ",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		for _, bad := range []string{"other:", "rx/cc"} {
			if strings.Contains(out, bad) {
				t.Errorf("output shows another instance's %q:\n%s", bad, out)
			}
		}
		if t.Failed() {
			return
		}
		t.Logf("\n%s", out)
	})

	t.Run("json", func(t *testing.T) {
		code, out, errOut := runCmd(t, "status", "--state-dsn", dsn, "--dsn", "ignored:x@tcp(127.0.0.1:1)/", "--state-db", schema, "--instance", "shop", "--json")
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var st inspect.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		if len(st.Pipes) != 1 || st.Pipes[0].Dead != 1 || st.Pipes[0].DrainHolder != "r2/bb" {
			t.Errorf("pipes = %+v", st.Pipes)
		}
		if len(st.Leases) != 2 || st.Checkpoint == nil || st.Checkpoint.Epoch != 2 {
			t.Errorf("leases = %+v checkpoint = %+v", st.Leases, st.Checkpoint)
		}
		if st.Fleet.Expected != 3 || len(st.Fleet.Missing) != 1 {
			t.Errorf("fleet = %+v", st.Fleet)
		}
	})

	t.Run("empty instance", func(t *testing.T) {
		code, out, errOut := runCmd(t, "status", "--dsn", dsn, "--state-db", schema, "--instance", "nobody")
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if !strings.Contains(out, "checkpoint none yet") || !strings.Contains(out, "FLEET 0/0 responded") {
			t.Errorf("output:\n%s", out)
		}
	})
}

func TestFleetForget(t *testing.T) {
	dsn, schema := statusFixture(t)
	code, out, errOut := runCmd(t, "fleet", "forget", "--dsn", dsn, "--state-db", schema, "r3")
	if code != ExitOK || !strings.Contains(out, "forgot replica r3 (1 row)") {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	code, _, errOut = runCmd(t, "fleet", "forget", "--dsn", dsn, "--state-db", schema, "r3")
	if code != ExitFailure || !strings.Contains(errOut, "no fleet rows for replica r3") {
		t.Fatalf("second forget: exit %d: %s", code, errOut)
	}
	if code, _, _ := runCmd(t, "fleet", "forget", "--dsn", dsn); code != ExitConfig {
		t.Fatalf("forget without id: exit %d, want %d", code, ExitConfig)
	}
	_, out, _ = runCmd(t, "status", "--dsn", dsn, "--state-db", schema, "--instance", "shop")
	if strings.Contains(out, "r3") {
		t.Fatalf("status still shows the forgotten replica:\n%s", out)
	}
}

// TestPasswordNeverPrinted runs commands against an unreachable server
// with a DSN carrying a password and greps everything they print
// (issue 6 §4: a DSN password is never logged).
func TestPasswordNeverPrinted(t *testing.T) {
	const pw = "SuperSecretPw"
	dsn := "root:" + pw + "@tcp(127.0.0.1:1)/"
	for _, args := range [][]string{
		{"status", "--dsn", dsn},
		{"status", "--state-dsn", dsn, "--json"},
		{"status", "--dsn", "root:" + pw + "@tcp(127.0.0.1:1", "--json"}, // unparsable
		{"fleet", "forget", "--dsn", dsn, "r1"},
		{"dead", "list", "--dsn", dsn},
		{"tail", "--dsn", dsn, "--limit", "1", "--log-format", "json", "--log-level", "debug"},
		{"tail", "--dsn", dsn, "--log-format", "console"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code, out, errOut := runArgs(t, ctx, args...)
		cancel()
		if code == ExitOK {
			t.Errorf("%v: exit 0 against an unreachable server", args)
		}
		if strings.Contains(out, pw) || strings.Contains(errOut, pw) {
			t.Errorf("%v prints the password:\nstdout: %s\nstderr: %s", args, out, errOut)
		}
		if errOut == "" {
			t.Errorf("%v: no error printed", args)
		}
	}
}

// TestInspectAgainstRunningReplica runs `cdcout run` in-process against a
// real server with a password-protected user, writes rows, and checks that
// the inspect endpoints and `cdcout status` show them — and that neither
// any endpoint nor the replica's logs contain the password.
func TestInspectAgainstRunningReplica(t *testing.T) {
	const pw = "SuperSecretPw"
	srv := mysqltest.Shared(t)
	stateDB := srv.CreateDB(t, "insrun")
	src := srv.CreateDB(t, "insrunsrc")
	user := "u_" + stateDB
	srv.Exec(t,
		"CREATE USER IF NOT EXISTS '"+user+"'@'%' IDENTIFIED BY '"+pw+"'",
		"GRANT ALL ON *.* TO '"+user+"'@'%'",
		"CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v VARCHAR(20))")
	t.Cleanup(func() { srv.Exec(t, "DROP USER IF EXISTS '"+user+"'@'%'") })
	mc, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.User, mc.Passwd = user, pw
	dsn := mc.FormatDSN()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var (
		code           int
		stdout, stderr string
	)
	go func() {
		defer close(done)
		code, stdout, stderr = runArgs(t, ctx, "run", "--dsn", dsn, "--state-db", stateDB, "--instance", stateDB,
			"--tables", src+".*", "--sink", "f=file://"+out, "--http-addr", addr,
			"--log-format", "json", "--log-level", "debug")
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stop()

	base := "http://" + addr
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			select {
			case <-done:
				t.Fatalf("replica exited (%d) while waiting for %s:\n%s", code, what, stderr)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	httpGet := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor("the binlog connection", func() bool {
		c, body := httpGet("/v1/source")
		return c == 200 && strings.Contains(body, `"connected":true`)
	})
	srv.Exec(t, "INSERT INTO `"+src+"`.t VALUES (1, 'a'), (2, 'b')", "UPDATE `"+src+"`.t SET v = 'c' WHERE id = 2")
	pipe := stateDB + ":" + src + ".t:f"
	var sinks struct {
		Pipes []inspect.PipeStatus `json:"pipes"`
	}
	waitFor("3 delivered rows in /v1/sinks", func() bool {
		c, body := httpGet("/v1/sinks")
		if c != 200 || json.Unmarshal([]byte(body), &sinks) != nil {
			return false
		}
		return len(sinks.Pipes) == 1 && sinks.Pipes[0].Delivered == 3
	})
	if got := sinks.Pipes[0].Pipe; got != pipe {
		t.Errorf("pipe = %q, want %q", got, pipe)
	}

	c, body := httpGet("/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if c != 200 || err != nil {
		t.Fatalf("/metrics = %d, parse: %v", c, err)
	}
	found := false
	for _, m := range fams["cdcout_outbox_rows"].GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["pipe"] == pipe && labels["status"] == "delivered" {
			found = true
			// The collector caches for 5s; rows may be counted before all
			// three were delivered.
			if v := m.GetGauge().GetValue(); v < 1 || v > 3 {
				t.Errorf("cdcout_outbox_rows delivered = %v", v)
			}
		}
	}
	if !found {
		t.Errorf("no cdcout_outbox_rows{pipe=%q,status=delivered} in:\n%s", pipe, body)
	}
	// Every change read is counted by table and op, and the source is up.
	changes := map[string]float64{}
	for _, m := range fams["cdcout_changes_total"].GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["table"] == src+".t" {
			changes[labels["op"]] = m.GetCounter().GetValue()
		}
	}
	if changes["c"] != 2 || changes["u"] != 1 {
		t.Errorf("cdcout_changes_total for %s.t = %v, want c=2 u=1", src, changes)
	}
	if got := fams["cdcout_source_connected"].GetMetric(); len(got) != 1 || got[0].GetGauge().GetValue() != 1 {
		t.Errorf("cdcout_source_connected = %v, want 1", got)
	}
	var source struct {
		LastEventAt time.Time `json:"lastEventAt"`
	}
	if c, body := httpGet("/v1/source"); c != 200 || json.Unmarshal([]byte(body), &source) != nil || source.LastEventAt.IsZero() {
		t.Errorf("/v1/source has no lastEventAt after changes were read: %d %s", c, body)
	}
	if c, body := httpGet("/readyz"); c != 200 {
		t.Errorf("readyz = %d %s", c, body)
	}

	code2, statusOut, statusErr := runArgs(t, context.Background(), "status", "--dsn", dsn, "--state-db", stateDB, "--instance", stateDB)
	if code2 != ExitOK || !strings.Contains(statusOut, pipe) || !strings.Contains(statusOut, "enqueue/"+stateDB) {
		t.Errorf("status: exit %d\n%s%s", code2, statusOut, statusErr)
	}

	// The leader's fleet row carries its binlog runway reading (MariaDB's
	// default expiry is none, MySQL's 30 days).
	waitFor("the binlog runway in cdcout status", func() bool {
		_, statusOut, statusErr = runArgs(t, context.Background(), "status", "--dsn", dsn, "--state-db", stateDB, "--instance", stateDB)
		return strings.Contains(statusOut, "binlog runway unlimited: the server never purges ") ||
			strings.Contains(statusOut, "(binlog_expire_logs_seconds=2592000)")
	})

	bodies := map[string]string{"status stdout": statusOut, "status stderr": statusErr}
	for _, p := range []string{"/", "/healthz", "/readyz", "/metrics", "/v1/source", "/v1/sinks", "/v1/fleet", "/v1/leases", "/v1/dead"} {
		_, b := httpGet(p)
		bodies["GET "+p] = b
	}
	stop()
	if code != ExitOK {
		t.Errorf("replica exit %d:\n%s", code, stderr)
	}
	bodies["replica stdout"], bodies["replica stderr"] = stdout, stderr
	if !strings.Contains(stderr, user) {
		t.Errorf("replica logs never name the user; is the log captured?\n%s", stderr)
	}
	for name, b := range bodies {
		if strings.Contains(b, pw) {
			t.Errorf("%s contains the password:\n%s", name, b)
		}
	}
}
