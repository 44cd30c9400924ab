package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

func TestNilMetricsIsANoop(t *testing.T) {
	var m *Metrics
	m.ObserveChange("a", "b", "c")
	m.ObserveEnqueue(outbox.EnqueueResult{Records: 1})
	m.ObserveDelivery("p", "delivered", time.Second)
	m.SetLeaseHeld("x", true)
	m.SetSourceLag(time.Second)
	m.SetSourceConnected(true)
	m.AddHandoffDroppedPending(1)
	m.SetPreparedXA(1, time.Now())
	m.WatchOutbox(nil, 0)
	dm := m.DrainMetrics()
	if dm.Delivered != nil {
		t.Fatal("nil Metrics gave drain hooks")
	}
}

func TestEnqueueAndDrainHooks(t *testing.T) {
	m := New()
	m.ObserveEnqueue(outbox.EnqueueResult{Records: 3, AlreadyOurs: 1, OthersClaims: 2, DigestMismatches: 1})
	m.ObserveEnqueue(outbox.EnqueueResult{Records: 2})
	if got, want := value(t, m.claims.WithLabelValues("inserted")), 5.0; got != want {
		t.Errorf("claims inserted = %v, want %v", got, want)
	}
	if got, want := value(t, m.digestMismatch), 1.0; got != want {
		t.Errorf("digest mismatches = %v, want %v", got, want)
	}
	dm := m.DrainMetrics()
	dm.Retried("p", 4)
	dm.Error("p", "claim", errors.New("x"))
	m.ObserveDelivery("p", "retried", 0)
	if got, want := value(t, m.deliveries.WithLabelValues("p", "retried")), 5.0; got != want {
		t.Errorf("retried = %v, want %v", got, want)
	}
	if got, want := value(t, m.drainErrors.WithLabelValues("p", "claim")), 1.0; got != want {
		t.Errorf("drain errors = %v, want %v", got, want)
	}
}

func TestWatchOutboxCachesAndKeepsLastGood(t *testing.T) {
	m := New()
	calls := 0
	fail := false
	m.WatchOutbox(func(context.Context) ([]OutboxStat, error) {
		calls++
		if fail {
			return nil, errors.New("state db down")
		}
		return []OutboxStat{{Pipe: "i:d.t:s", Status: "pending", Records: 7, OldestPendingAge: 3 * time.Second}}, nil
	}, time.Hour)
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	for range 3 {
		if body := scrape(); !strings.Contains(body, `cdcout_outbox_rows{pipe="i:d.t:s",status="pending"} 7`) ||
			!strings.Contains(body, `cdcout_outbox_oldest_pending_age_seconds{pipe="i:d.t:s"} 3`) {
			t.Fatalf("scrape lacks outbox gauges:\n%s", body)
		}
	}
	if calls != 1 {
		t.Fatalf("reader called %d times in the cache window, want 1", calls)
	}
	// Expire the cache with a failing reader: the last values stay.
	fail = true
	m.WatchOutbox(m.outbox.read, time.Nanosecond)
	if body := scrape(); !strings.Contains(body, `cdcout_outbox_rows{pipe="i:d.t:s",status="pending"} 7`) {
		t.Fatalf("after a failed read:\n%s", body)
	}
	// The registry gathers collectors concurrently, so the error counter
	// bumped inside this scrape's Collect may only show in the next scrape;
	// read it directly.
	if got, want := value(t, m.drainErrors.WithLabelValues("", "outbox_stats")), 1.0; got != want {
		t.Fatalf("outbox_stats errors = %v, want %v", got, want)
	}
}

func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func TestPreparedXA(t *testing.T) {
	m := New()
	m.SetPreparedXA(2, time.Now().Add(-90*time.Second))
	if got := value(t, m.xaPrepared); got != 2 {
		t.Fatalf("xa prepared = %v, want 2", got)
	}
	body := scrapeBody(t, m)
	i := strings.Index(body, "\ncdcout_xa_prepared_oldest_seconds ")
	if i < 0 {
		t.Fatalf("no oldest-age gauge in\n%s", body)
	}
	var age float64
	if _, err := fmt.Sscan(body[i+len("\ncdcout_xa_prepared_oldest_seconds "):], &age); err != nil || age < 89 || age > 120 {
		t.Fatalf("oldest age = %v (%v), want ~90 s", age, err)
	}
	m.SetPreparedXA(0, time.Time{})
	if body := scrapeBody(t, m); !strings.Contains(body, "\ncdcout_xa_prepared_oldest_seconds 0\n") || !strings.Contains(body, "\ncdcout_xa_prepared 0\n") {
		t.Fatalf("after the outcome:\n%s", body)
	}
}

func scrapeBody(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func TestWatchEndpoints(t *testing.T) {
	m := New()
	m.WatchEndpoints(func() []EndpointStat {
		return []EndpointStat{{Sink: "hook", LimiterStats: sink.LimiterStats{Limit: 5, InFlight: 3, RTT: 20 * time.Millisecond, Floor: 5 * time.Millisecond, Overloads: 2}}}
	})
	body := scrapeBody(t, m)
	for _, want := range []string{
		`cdcout_sink_concurrency_limit{sink="hook"} 5`,
		`cdcout_sink_inflight{sink="hook"} 3`,
		`cdcout_sink_rtt_seconds{sink="hook"} 0.02`,
		`cdcout_sink_rtt_floor_seconds{sink="hook"} 0.005`,
		`cdcout_sink_overloads_total{sink="hook"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
