package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/faultproxy"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// proxiedDB opens the shared server through a fault proxy.
func proxiedDB(t *testing.T) (*sql.DB, *faultproxy.Proxy) {
	t.Helper()
	srv := mysqltest.Shared(t)
	p, err := faultproxy.Start(net.JoinHostPort(srv.Host, strconv.Itoa(srv.Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	cfg, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr, cfg.Net = p.Addr(), "tcp"
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 2*time.Second, 5*time.Second, 5*time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, p
}

// Issue 14, defect 1: a segment whose claim could not be released because
// the state connection dropped is taken back by the same live drainer on
// its next pass, not left to the claim lease (5 minutes here) while every
// later segment of the pipe waits behind it.
func TestStuckSegmentClaimIsTakenBack(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	order := enqueueTxns(t, st, pipe, 3, 4)
	db, proxy := proxiedDB(t)
	log := newDeliveryLog()
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink()}}, func(c *DrainerConfig) {
		c.DB = db
		c.ClaimLease = 5 * time.Minute
	})
	p := d.pipes[0]
	seg, err := p.claimSegment(context.Background())
	if err != nil || seg == nil {
		t.Fatalf("claim = %+v, %v; want the oldest segment", seg, err)
	}
	// The state database goes away between the claim and its release.
	proxy.Refuse()
	proxy.Reset()
	rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	p.releaseSegment(rctx, seg.id)
	cancel()
	if p.stuck == nil || p.stuck.id != seg.id {
		t.Fatalf("a failed release left stuck = %+v, want segment %s remembered", p.stuck, seg.id)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {segments} WHERE id = ? AND claimer = ?", seg.id, d.claimer); n != 1 {
		t.Fatalf("the segment is not claimed by us after the failed release (%d); the test did not make it fail", n)
	}
	proxy.Heal()
	healed := time.Now()

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()
	waitFor(t, "every segment delivered", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {segments} WHERE status <> 'done'") == 0
	})
	t.Logf("heal to every segment delivered: %v", time.Since(healed).Round(time.Millisecond))
	if took := time.Since(healed); took > 5*time.Second {
		t.Fatalf("delivery resumed %v after the heal, want within seconds (not the claim lease)", took)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	idOf := map[string]string{}
	for _, r := range records(t, st.db, st.schema) {
		idOf[r.ChangeKey] = r.ID
	}
	for key, cks := range order {
		var want []string
		for _, ck := range cks {
			want = append(want, idOf[ck])
		}
		if got := log.byKey[key]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("key %s delivered %v, want %v (commit order, once each)", key, got, want)
		}
	}
}
