package inspect

import (
	"net/http"
	"sync"
	"time"
)

// Source lag history: the process samples the source's lag every
// historyEvery and keeps historyLen samples (10 minutes), so the
// dashboard's chart shows the recent past on every load instead of only
// what one open page has polled.
const (
	historyEvery = 2 * time.Second
	historyLen   = 300
)

// LagSample is one point of the history: the lag in seconds, or null
// while the source was not connected.
type LagSample struct {
	TimeMs     int64    `json:"t"`
	LagSeconds *float64 `json:"lag"`
}

// lagHistory is a ring of samples.
type lagHistory struct {
	mu      sync.Mutex
	samples []LagSample
	next    int
}

func (h *lagHistory) add(at time.Time, src SourceStatus) {
	smp := LagSample{TimeMs: at.UnixMilli()}
	if src.Connected {
		lag := src.Lag.Seconds()
		smp.LagSeconds = &lag
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.samples) < historyLen {
		h.samples = append(h.samples, smp)
		return
	}
	h.samples[h.next] = smp
	h.next = (h.next + 1) % historyLen
}

// snapshot returns the samples, oldest first.
func (h *lagHistory) snapshot() []LagSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]LagSample, 0, len(h.samples))
	out = append(out, h.samples[h.next:]...)
	return append(out, h.samples[:h.next]...)
}

func (s *Server) lagHistory(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, map[string]any{
		"intervalSeconds": historyEvery.Seconds(),
		// Binlog event times have one-second resolution: below a second
		// the lag reads as anything from 0 to 1 s.
		"resolutionSeconds": 1,
		"samples":           s.history.snapshot(),
	})
}
