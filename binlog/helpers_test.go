package binlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// replicaIDs hands every stream of the test binary its own server id: two
// readers with one id would make the server drop one of them.
var replicaIDs atomic.Uint32

func nextServerID() uint32 { return 5000 + replicaIDs.Add(1) }

// testConfig is a Config for srv capturing only the given databases.
func testConfig(t testing.TB, srv *mysqltest.Server, dbs ...string) Config {
	t.Helper()
	cfg := Config{
		DSN:             srv.DSN,
		ServerID:        nextServerID(),
		From:            "now",
		Instance:        "test",
		Version:         "test",
		HeartbeatPeriod: time.Second,
		ReadTimeout:     5 * time.Second,
		Logger:          zaptest.NewLogger(t),
	}
	for _, db := range dbs {
		cfg.Include = append(cfg.Include, db+".*")
	}
	return cfg
}

func openStream(t testing.TB, cfg Config) *Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// collector runs a Stream in the background and records its events.
type collector struct {
	mu     sync.Mutex
	events []Event
	done   chan struct{}
	err    error
}

func collect(t testing.TB, s *Stream) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		err := s.Run(ctx, func(_ context.Context, ev Event) error {
			c.mu.Lock()
			c.events = append(c.events, ev)
			c.mu.Unlock()
			return nil
		})
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
		if c.err != nil && !errors.Is(c.err, context.Canceled) {
			t.Errorf("run: %v", c.err)
		}
	})
	return c
}

func (c *collector) snapshot() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Event(nil), c.events...)
}

func changesOf(evs []Event) []*canonical.Change {
	var out []*canonical.Change
	for _, ev := range evs {
		if ev.Change != nil {
			out = append(out, ev.Change)
		}
	}
	return out
}

// waitChanges waits until at least n changes arrived and returns all
// events so far.
func (c *collector) waitChanges(t testing.TB, n int) []Event {
	t.Helper()
	return c.waitFor(t, func(evs []Event) bool { return len(changesOf(evs)) >= n }, "%d changes", n)
}

func (c *collector) waitFor(t testing.TB, cond func([]Event) bool, what string, args ...any) []Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := c.snapshot()
		if cond(evs) {
			return evs
		}
		select {
		case <-c.done:
			t.Fatalf("stream ended while waiting for "+what+": %v", append(args, c.err)...)
		default:
		}
		if time.Now().After(deadline) {
			var have []string
			for _, ch := range changesOf(evs) {
				have = append(have, fmt.Sprintf("%s %s.%s", ch.Op, ch.Source.DB, ch.Source.Table))
			}
			t.Fatalf("timed out waiting for "+what+"; have %d changes: %s", append(args, len(have), strings.Join(have, ", "))...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
