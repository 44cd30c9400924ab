package inspect

import (
	"fmt"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/wait"
)

// TestLagHistoryRing: the ring keeps the newest historyLen samples, oldest
// first, and a disconnected source is a gap (null), not a zero lag.
func TestLagHistoryRing(t *testing.T) {
	var h lagHistory
	base := time.UnixMilli(1_000_000)
	for i := range historyLen + 7 {
		h.add(base.Add(time.Duration(i)*time.Second), SourceStatus{Connected: i%2 == 0, Lag: time.Duration(i) * time.Second})
	}
	got := h.snapshot()
	if len(got) != historyLen {
		t.Fatalf("%d samples, want %d", len(got), historyLen)
	}
	for i, smp := range got {
		n := i + 7
		if smp.TimeMs != base.Add(time.Duration(n)*time.Second).UnixMilli() {
			t.Fatalf("sample %d at %d, want the %dth", i, smp.TimeMs, n)
		}
		if (n%2 == 0) != (smp.LagSeconds != nil) || (smp.LagSeconds != nil && *smp.LagSeconds != float64(n)) {
			t.Fatalf("sample %d: lag %v", i, smp.LagSeconds)
		}
	}
}

// TestLagHistoryServed: a running server samples the source by itself and
// serves the history, so a dashboard opened now sees the past.
func TestLagHistoryServed(t *testing.T) {
	deps := testDeps(t)
	deps.Source = func() SourceStatus { return SourceStatus{Connected: true, Lag: 1500 * time.Millisecond} }
	s := serve(t, Config{Addr: "127.0.0.1:0"}, deps)
	var v struct {
		IntervalSeconds   float64
		ResolutionSeconds float64
		Samples           []LagSample
	}
	wait.Until(t, "a history sample", 5*time.Second, func() bool {
		getJSON(t, fmt.Sprintf("http://%s/v1/source/history", s.Addr()), &v)
		return len(v.Samples) > 0
	})
	if len(v.Samples) == 0 || v.Samples[0].LagSeconds == nil || *v.Samples[0].LagSeconds != 1.5 || v.IntervalSeconds != 2 || v.ResolutionSeconds != 1 {
		t.Fatalf("history %+v", v)
	}
}
