package httpsink

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/sink"
)

// A connect to a listener whose accept queue is full (its SYN dropped,
// sent again only after a second) is given up soon after the fastest
// connects seen, not after a quarter of a second: every millisecond it
// waits holds a slot of the endpoint's limit.
func TestDroppedConnectGivenUpEarly(t *testing.T) {
	ln, err := sinktest.ListenBacklog(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dd := &dialer{max: dialTimeout(defaultTimeout), lim: sink.NewLimiter(0, 0)}
	ctx := context.Background()
	// Never accepted: the first connects fill the accept queue (and teach
	// the dialer how fast a connect is); then one waits.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for len(conns) < 8 {
		start := time.Now()
		c, err := dd.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			if len(conns) == 0 {
				t.Fatalf("first connect: %v", err)
			}
			if d := time.Since(start); d >= 100*time.Millisecond {
				t.Errorf("dropped connect given up after %v, want under 100ms", d)
			}
			if !isTimeout(err) {
				t.Errorf("dropped connect: %v, want a timeout", err)
			}
			return
		}
		conns = append(conns, c)
	}
	t.Fatalf("%d connects completed against an accept queue of one", len(conns))
}
