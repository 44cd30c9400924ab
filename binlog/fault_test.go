package binlog

import (
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// waitHealth polls s.Health until cond holds and returns how long it took.
func waitHealth(t *testing.T, s *Stream, what string, within time.Duration, cond func(Health) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond(s.Health()) {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v (health %+v)", what, within, s.Health())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// Issue 14, defect 2: Health follows the link. A blackholed link (sockets
// open, nothing forwarded) is reported down within a few heartbeat periods
// and its session ends after the read timeout, not after a read timeout
// plus a close blocked as long again; a killed server (connections reset,
// the port refusing) is reported down at once. After each heal the stream
// reconnects and the change committed during the outage arrives.
func TestHealthFollowsTheLink(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "health")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY)")
	cfg := testConfig(t, srv, db)
	dsn, proxy := srv.ProxiedDSN(t)
	cfg.DSN = dsn
	cfg.HeartbeatPeriod = 500 * time.Millisecond
	cfg.ReadTimeout = 3 * time.Second
	s := openStream(t, cfg)
	if h := s.Health(); h.Connected {
		t.Fatalf("health before Run = %+v, want not connected", h)
	}
	c := collect(t, s)
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (1)")
	c.waitChanges(t, 1)
	waitHealth(t, s, "connected while streaming", 5*time.Second, func(h Health) bool { return h.Connected })
	// Heartbeats keep an idle link connected.
	time.Sleep(2 * time.Second)
	if h := s.Health(); !h.Connected {
		t.Fatalf("idle stream with heartbeats = %+v, want connected", h)
	}

	proxy.Blackhole()
	down := waitHealth(t, s, "blackholed link reported down", 3*time.Second, func(h Health) bool { return !h.Connected })
	lost := waitHealth(t, s, "blackholed session ended", cfg.ReadTimeout+3*time.Second, func(h Health) bool {
		return !h.Connected && !strings.HasPrefix(h.Error, "no event or heartbeat")
	})
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (2)")
	time.Sleep(time.Second)
	proxy.Heal()
	healed := time.Now()
	c.waitChanges(t, 2)
	resumed := time.Since(healed)
	waitHealth(t, s, "connected after the heal", 5*time.Second, func(h Health) bool { return h.Connected })
	t.Logf("blackhole: reported down after %v, session ended after %v more, heal to resumed %v",
		down.Round(time.Millisecond), lost.Round(time.Millisecond), resumed.Round(time.Millisecond))

	// The server "dies": open connections reset, the port refuses.
	proxy.Refuse()
	proxy.Reset()
	kill := waitHealth(t, s, "killed server reported down", 2*time.Second, func(h Health) bool { return !h.Connected })
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (3)")
	time.Sleep(time.Second)
	proxy.Heal()
	healed = time.Now()
	c.waitChanges(t, 3)
	t.Logf("kill: reported down after %v, heal to resumed %v", kill.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	if h := s.Health(); !h.Connected || h.Error != "" || time.Since(h.LastContact) > 2*time.Second {
		t.Fatalf("health after recovery = %+v", h)
	}
}
