package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/metrics"
)

const secretPw = "SuperSecretPw"

func testDeps(t *testing.T) Deps {
	db, schema := fixture(t)
	return Deps{
		DB: db, Schema: schema, Instance: "inst", ReplicaID: "replica-a",
		Metrics: metrics.New(),
		Source: func() SourceStatus {
			return SourceStatus{Connected: true, Role: "leader", Lag: 1500 * time.Millisecond,
				Position:     binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-42"},
				IdentityMode: "gtid", Flavor: "mariadb", MetadataMode: "binlog",
				DSN:   "repl:" + secretPw + "@tcp(127.0.0.1:3306)/",
				Error: "earlier: dial repl:" + secretPw + "@127.0.0.1",
			}
		},
		Pipes:          func() []string { return []string{"inst:shop.items:hook", "other:x.y:z"} },
		DroppedPending: func() int64 { return 4 },
		Endpoints: func() map[string]EndpointStatus {
			return map[string]EndpointStatus{"hook": {Limit: 3, Max: 64, InFlight: 2, RTTMs: 4.5, FloorMs: 1.2, Overloads: 7}}
		},
		Secrets: []string{secretPw},
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	return do(t, "GET", url, "")
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, body := get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, body)
	}
}

func TestEndpoints(t *testing.T) {
	hs := httptest.NewServer(New(Config{}, testDeps(t)).Handler())
	defer hs.Close()

	t.Run("sinks", func(t *testing.T) {
		var v sinksView
		getJSON(t, hs.URL+"/v1/sinks", &v)
		if got, want := v.DroppedPending, int64(4); got != want {
			t.Errorf("droppedPending = %d, want %d", got, want)
		}
		var names []string
		for _, p := range v.Pipes {
			names = append(names, p.Pipe)
		}
		// carts has only a segment; items is configured without any.
		if got, want := strings.Join(names, " "), "inst:shop.carts:hook inst:shop.items:hook inst:shop.orders:hook inst:shop.users:hook"; got != want {
			t.Fatalf("pipes = %s, want %s", got, want)
		}
		// Records: 3 pending rows and a pending segment of 3; 2 delivered
		// rows, a done segment of 5 and the row of one record that left it
		// (delivered once, not twice); 1 dead row.
		// The webhook's adaptive concurrency shows on each of its pipes.
		for _, p := range v.Pipes {
			if e := p.Endpoint; e == nil || e.Limit != 3 || e.Max != 64 || e.InFlight != 2 || e.Overloads != 7 {
				t.Errorf("pipe %s endpoint = %+v, want the hook sink's", p.Pipe, e)
			}
		}
		o := v.Pipes[2]
		if o.Pending != 6 || o.Delivered != 7 || o.Dead != 1 || o.Delivering != 0 {
			t.Errorf("orders counts = %+v, want 6 pending, 7 delivered, 1 dead", o)
		}
		if o.Table != "shop.orders" || o.Sink != "hook" {
			t.Errorf("table/sink = %q/%q", o.Table, o.Sink)
		}
		// The pending segment (40 s) is older than the oldest pending row
		// (30 s).
		if o.OldestPendingAgeSeconds < 39 || o.OldestPendingAgeSeconds > 70 {
			t.Errorf("oldest pending age = %v, want ~40s", o.OldestPendingAgeSeconds)
		}
		if o.DeliveryLagSeconds < 41 || o.DeliveryLagSeconds > 72 {
			t.Errorf("delivery lag = %v, want ~42s", o.DeliveryLagSeconds)
		}
		// The most recent error of an undelivered row: the retrying one
		// (2s ago) rather than the dead one (9s ago).
		if o.LastError != "connection refused" || o.LastErrorAt == nil {
			t.Errorf("last error = %q at %v", o.LastError, o.LastErrorAt)
		}
		if got, want := o.DrainHolder, "replica-b/n2"; got != want {
			t.Errorf("drain holder = %q, want %q", got, want)
		}
		if v.Pipes[3].Delivered != 1 || v.Pipes[3].OldestPendingAgeSeconds != 0 || v.Pipes[3].DrainHolder != "" {
			t.Errorf("users pipe = %+v", v.Pipes[3])
		}
		if c := v.Pipes[0]; c.Delivered != 2 || c.Pending != 0 || c.Dead != 0 || c.OldestPendingAgeSeconds != 0 {
			t.Errorf("carts pipe = %+v, want 2 delivered records", c)
		}
	})

	t.Run("leases", func(t *testing.T) {
		var v struct{ Leases []LeaseStatus }
		getJSON(t, hs.URL+"/v1/leases", &v)
		if len(v.Leases) != 2 || v.Leases[0].Name != "drain/inst:shop.orders:hook" || v.Leases[1].Name != "enqueue/inst" {
			t.Fatalf("leases = %+v", v.Leases)
		}
		if l := v.Leases[1]; !l.Live || l.Epoch != 3 || l.Holder != "replica-a/n1" || l.ExpiresInSeconds <= 0 {
			t.Fatalf("enqueue lease = %+v", l)
		}
	})

	t.Run("fleet", func(t *testing.T) {
		var f Fleet
		getJSON(t, hs.URL+"/v1/fleet", &f)
		// Members: replica-a (lease + row), replica-b (drain lease, no
		// row: missing), replica-c (row 200s old: stale, still a member).
		if f.Expected != 3 || f.Responded != 1 {
			t.Errorf("responded/expected = %d/%d, want 1/3", f.Responded, f.Expected)
		}
		if len(f.Missing) != 1 || f.Missing[0] != "replica-b" {
			t.Errorf("missing = %v", f.Missing)
		}
		if len(f.Stale) != 1 || f.Stale[0].ReplicaID != "replica-c" || f.Stale[0].AgeSeconds < 199 {
			t.Errorf("stale = %v", f.Stale)
		}
		if f.Versions["v1.2.0"] != 1 || f.Versions["v1.1.0"] != 1 || len(f.Versions) != 2 {
			t.Errorf("versions = %v (the other instance's replica must not count)", f.Versions)
		}
		if len(f.Replicas) != 2 || f.Replicas[0].Payload.Role != "leader" {
			t.Errorf("replicas = %+v", f.Replicas)
		}
	})

	t.Run("dead", func(t *testing.T) {
		var v struct{ Dead []DeadRow }
		getJSON(t, hs.URL+"/v1/dead?limit=50", &v)
		if len(v.Dead) != 1 || v.Dead[0].LastError != deadError || v.Dead[0].Attempts != 10 || v.Dead[0].Table != "shop.orders" || v.Dead[0].RowKey != `{"id":6}` {
			t.Fatalf("dead = %+v", v.Dead)
		}
	})

	t.Run("source", func(t *testing.T) {
		var v sourceView
		getJSON(t, hs.URL+"/v1/source", &v)
		if v.LagSeconds != 1.5 || v.Position.GTIDSet != "0-1-42" || v.IdentityMode != "gtid" || v.MetadataMode != "binlog" {
			t.Fatalf("source = %+v", v)
		}
		if got, want := v.DSN, "repl:[redacted]@tcp(127.0.0.1:3306)/"; got != want {
			t.Fatalf("dsn = %q, want %q", got, want)
		}
	})

	t.Run("ready", func(t *testing.T) {
		if code, body := get(t, hs.URL+"/readyz"); code != http.StatusOK {
			t.Fatalf("readyz = %d %s", code, body)
		}
		if code, body := get(t, hs.URL+"/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Fatalf("healthz = %d %s", code, body)
		}
	})

	t.Run("dashboard", func(t *testing.T) {
		code, body := get(t, hs.URL+"/")
		if code != http.StatusOK || !strings.Contains(body, "<title>cdcout</title>") {
			t.Fatalf("dashboard = %d", code)
		}
		if strings.Contains(body, "http://") && !strings.Contains(body, "http://www.w3.org/2000/svg") || strings.Contains(body, "https://") {
			t.Fatalf("dashboard references an external URL")
		}
		if code, _ := get(t, hs.URL+"/nope"); code != http.StatusNotFound {
			t.Fatalf("GET /nope = %d, want 404", code)
		}
	})
}

func TestNoSecretInAnyResponse(t *testing.T) {
	deps := testDeps(t)
	// Without the scrub list: the DSN redaction alone must keep the
	// password out of /v1/source; the error text is the engine's duty and
	// is caught by the scrub list, tested below.
	deps.Source = func() SourceStatus {
		return SourceStatus{Connected: true, DSN: "repl:" + secretPw + "@tcp(127.0.0.1:3306)/"}
	}
	deps.Secrets = nil
	hs := httptest.NewServer(New(Config{}, deps).Handler())
	defer hs.Close()
	withScrub := testDeps(t)
	hs2 := httptest.NewServer(New(Config{}, withScrub).Handler())
	defer hs2.Close()
	for _, base := range []string{hs.URL, hs2.URL} {
		for _, p := range []string{"/", "/healthz", "/readyz", "/metrics", "/v1/source", "/v1/sinks", "/v1/fleet", "/v1/leases", "/v1/dead"} {
			code, body := get(t, base+p)
			if code != http.StatusOK {
				t.Errorf("GET %s = %d", p, code)
			}
			if strings.Contains(body, secretPw) {
				t.Errorf("GET %s leaks the password:\n%s", p, body)
			}
		}
	}
}

func TestReadyzReasons(t *testing.T) {
	deps := testDeps(t)
	var src SourceStatus
	deps.Source = func() SourceStatus { return src }
	ready := true
	deps.Ready = func() (bool, string) { return ready, "engine starting" }
	hs := httptest.NewServer(New(Config{StallAfter: time.Minute, RunwayMin: time.Hour}, deps).Handler())
	defer hs.Close()
	for _, tc := range []struct {
		name  string
		src   SourceStatus
		ready bool
		code  int
		want  string
	}{
		{"not connected", SourceStatus{Error: "dial tcp: refused"}, true, 503, "binlog not connected: dial tcp: refused"},
		{"standby", SourceStatus{Following: true}, true, 200, "ready"},
		{"stalled", SourceStatus{Connected: true, Lag: 2 * time.Minute}, true, 503, "stalled: source lag 2m0s exceeds 1m0s"},
		{"engine not ready", SourceStatus{Connected: true}, false, 503, "engine starting"},
		{"binlog runway short", SourceStatus{Connected: true, Runway: &binlog.Runway{File: "b.000003", PurgeAt: time.Now().Add(10 * time.Minute), Limit: "binlog_expire_logs_seconds=600"}},
			true, 503, "below 1h0m0s: the server may purge b.000003 (it holds the checkpoint) at "},
		{"binlog runway long", SourceStatus{Connected: true, Runway: &binlog.Runway{File: "b.000003", PurgeAt: time.Now().Add(2 * time.Hour)}}, true, 200, "ready"},
		{"binlog never purged", SourceStatus{Connected: true, Runway: &binlog.Runway{File: "b.000003", Never: true}}, true, 200, "ready"},
	} {
		src, ready = tc.src, tc.ready
		code, body := get(t, hs.URL+"/readyz")
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: readyz = %d %q, want %d containing %q", tc.name, code, body, tc.code, tc.want)
		}
	}
	// State database gone.
	src, ready = SourceStatus{Connected: true}, true
	deps.DB.Close()
	if code, body := get(t, hs.URL+"/readyz"); code != 503 || !strings.Contains(body, "state database unreachable") {
		t.Errorf("readyz with closed state db = %d %q", code, body)
	}
}

func TestMetricsParse(t *testing.T) {
	deps := testDeps(t)
	m := deps.Metrics
	m.ObserveChange("shop", "orders", "c")
	m.ObserveChange("shop", "orders", "c")
	dm := m.DrainMetrics()
	dm.Delivered("inst:shop.orders:hook", 5)
	dm.Dead("inst:shop.orders:hook", 1)
	dm.Batch("inst:shop.orders:hook", 5, 30*time.Millisecond)
	m.SetLeaseHeld("enqueue/inst", true)
	m.AddHandoffDroppedPending(2)
	hs := httptest.NewServer(New(Config{}, deps).Handler())
	defer hs.Close()

	code, body := get(t, hs.URL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	value := func(name string, labels map[string]string) (float64, bool) {
		f := fams[name]
		if f == nil {
			return 0, false
		}
	next:
		for _, mt := range f.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range mt.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case mt.Gauge != nil:
				return mt.GetGauge().GetValue(), true
			case mt.Counter != nil:
				return mt.GetCounter().GetValue(), true
			case mt.Histogram != nil:
				return float64(mt.GetHistogram().GetSampleCount()), true
			}
		}
		return 0, false
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"cdcout_changes_total", map[string]string{"table": "shop.orders", "op": "c"}, 2},
		{"cdcout_deliveries_total", map[string]string{"pipe": "inst:shop.orders:hook", "result": "delivered"}, 5},
		{"cdcout_deliveries_total", map[string]string{"pipe": "inst:shop.orders:hook", "result": "dead"}, 1},
		{"cdcout_delivery_duration_seconds", map[string]string{"pipe": "inst:shop.orders:hook"}, 1},
		{"cdcout_lease_held", map[string]string{"lease": "enqueue/inst"}, 1},
		{"cdcout_handoff_dropped_pending_total", nil, 2},
		{"cdcout_source_connected", nil, 1},
		{"cdcout_source_lag_seconds", nil, 1.5},
		{"cdcout_outbox_rows", map[string]string{"pipe": "inst:shop.orders:hook", "status": "pending"}, 6},
		{"cdcout_outbox_rows", map[string]string{"pipe": "inst:shop.orders:hook", "status": "delivered"}, 7},
		{"cdcout_outbox_rows", map[string]string{"pipe": "inst:shop.orders:hook", "status": "dead"}, 1},
		{"cdcout_outbox_rows", map[string]string{"pipe": "inst:shop.carts:hook", "status": "delivered"}, 2},
		{"cdcout_outbox_oldest_pending_age_seconds", map[string]string{"pipe": "inst:shop.carts:hook"}, 0},
		{"cdcout_build_info", nil, 1},
	} {
		got, ok := value(c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if age, ok := value("cdcout_outbox_oldest_pending_age_seconds", map[string]string{"pipe": "inst:shop.orders:hook"}); !ok || age < 39 || age > 70 {
		t.Errorf("oldest pending age = %v (found %v), want ~40 (the pending segment)", age, ok)
	}
	if _, ok := value("cdcout_outbox_rows", map[string]string{"pipe": "other:shop.orders:hook"}); ok {
		t.Errorf("another instance's pipe is in cdcout_outbox_rows")
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Errorf("go collector missing")
	}
}

func TestRunListensAndShutsDown(t *testing.T) {
	deps := testDeps(t)
	s := New(Config{Addr: "127.0.0.1:0", KeepAlive: 3 * time.Second}, deps)
	if got, want := s.cfg.HeadersTimeout, 8*time.Second; got != want {
		t.Fatalf("headers timeout = %v, want keep-alive + 5s = %v", got, want)
	}
	if d := New(Config{}, deps).cfg; d.KeepAlive != 72*time.Second || d.HeadersTimeout != 77*time.Second {
		t.Fatalf("defaults = %v/%v, want 72s/77s", d.KeepAlive, d.HeadersTimeout)
	}
	stop := wait.Background(t, 10*time.Second, s.Run)
	waitListening(t, s)
	if code, _ := get(t, "http://"+s.Addr().String()+"/healthz"); code != 200 {
		t.Fatalf("healthz = %d", code)
	}
	stop()
	if _, err := http.Get("http://" + s.Addr().String() + "/healthz"); err == nil {
		t.Fatal("server still answers after shutdown")
	}

	// "off" serves nothing and returns when the context ends.
	off := New(Config{Addr: "off"}, deps)
	octx, ocancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ocancel()
	if err := off.Run(octx); err != nil || off.Addr() != nil {
		t.Fatalf("off: %v %v", err, off.Addr())
	}
	if err := New(Config{Addr: "256.0.0.1:1"}, deps).Run(context.Background()); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("bad address: %v", err)
	}
}

// TestClaimedRowsCountAsDelivering: a claimed row or segment is pending
// with a claimer whose next attempt is the claim's expiry; its records count
// as delivering, not pending. A claim that lapsed (its claimer died) is due
// again and counts as pending.
func TestClaimedRowsCountAsDelivering(t *testing.T) {
	db, schema := fixture(t)
	outbox, segments := "`"+schema+"`.outbox", "`"+schema+"`.segments"
	// The fixture's orders pipe has 3 pending rows and a pending segment of
	// 3 records; claim two of the rows, one with a lapsed claim, and the
	// segment; add a segment of 4 records with a lapsed claim.
	for _, q := range []string{
		"UPDATE " + outbox + " SET claimer = 42, next_attempt_at = NOW(6) + INTERVAL 5 MINUTE WHERE id = '" + fixtureID(1) + "'",
		"UPDATE " + outbox + " SET claimer = 42, next_attempt_at = NOW(6) - INTERVAL 1 SECOND WHERE id = '" + fixtureID(3) + "'",
		"UPDATE " + segments + " SET claimer = 42, next_attempt_at = NOW(6) + INTERVAL 5 MINUTE WHERE id = '" + fixtureID(201) + "'",
		"INSERT INTO " + segments + " (id, pipe, sink, status, records, last_id, claimer, next_attempt_at, first_commit_ts, payload) VALUES ('" +
			fixtureID(204) + "', 'inst:shop.orders:hook', 'hook', 'pending', 4, '" + fixtureID(207) + "', 42, NOW(6) - INTERVAL 1 SECOND, NOW(6), 'x')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	r := Reader{DB: db, Schema: schema, Instance: "inst"}
	pipes, err := r.Pipes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pipes {
		if p.Pipe != "inst:shop.orders:hook" {
			continue
		}
		found = true
		if p.Pending != 6 || p.Delivering != 4 || p.Delivered != 7 || p.Dead != 1 {
			t.Fatalf("orders counts = %+v, want 6 pending, 4 delivering, 7 delivered, 1 dead", p)
		}
		if p.OldestPendingAgeSeconds < 39 {
			t.Fatalf("oldest pending age = %v, want ~40s: a claimed segment is still undelivered", p.OldestPendingAgeSeconds)
		}
	}
	if !found {
		t.Fatalf("no orders pipe in %+v", pipes)
	}
	stats, err := r.OutboxStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, s := range stats {
		if s.Pipe == "inst:shop.orders:hook" {
			got[s.Status] = s.Records
		}
	}
	if want := map[string]int64{"pending": 6, "delivering": 4, "delivered": 7, "dead": 1}; !maps.Equal(got, want) {
		t.Fatalf("orders stats = %v, want %v", got, want)
	}
}

// A segment held whole during a sink outage shows its error on the pipe,
// ahead of older row errors: it is what holds the pipe up.
func TestHeldSegmentErrorShown(t *testing.T) {
	db, schema := fixture(t)
	if _, err := db.Exec("INSERT INTO `" + schema + "`.segments (id, pipe, sink, status, records, last_id, next_attempt_at, last_error, last_error_at, first_commit_ts, payload) VALUES ('" +
		fixtureID(300) + "', 'inst:shop.orders:hook', 'hook', 'pending', 2, '" + fixtureID(301) + "', NOW(6) + INTERVAL 1 MINUTE, 'post http://hook: http 503', NOW(6), NOW(6), 'x')"); err != nil {
		t.Fatal(err)
	}
	pipes, err := (&Reader{DB: db, Schema: schema, Instance: "inst"}).Pipes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pipes {
		if p.Pipe == "inst:shop.orders:hook" {
			if p.LastError != "post http://hook: http 503" || p.LastErrorAt == nil {
				t.Fatalf("orders last error = %q at %v, want the held segment's", p.LastError, p.LastErrorAt)
			}
			return
		}
	}
	t.Fatalf("no orders pipe in %+v", pipes)
}

// waitListening waits until s listens.
func waitListening(t *testing.T, s *Server) {
	t.Helper()
	wait.Until(t, "the server to listen", 5*time.Second, func() bool {
		return s.Addr() != nil && (s.cfg.Admin.Addr == "" || s.AdminAddr() != nil)
	})
}

// serve runs a server with cfg and deps until the test ends (its Run must
// then return nil) and returns it listening.
func serve(t *testing.T, cfg Config, deps Deps) *Server {
	t.Helper()
	s := New(cfg, deps)
	wait.Background(t, 30*time.Second, s.Run)
	waitListening(t, s)
	return s
}
