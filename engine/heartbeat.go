package engine

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/outbox"
)

// heartbeats is what the per-sink heartbeats (config heartbeat:) need:
// when each sink last got a record enqueued or a heartbeat, and the
// commit time of the last transaction read.
type heartbeats struct {
	mu         sync.Mutex
	last       map[string]time.Time // by sink name
	sourceTime time.Time
	failing    map[string]bool // sinks whose last heartbeat failed (logged once)
}

// enqueued notes records written for pipes ("<instance>:<db.table>:<sink>").
func (h *heartbeats) enqueued(pipes []string) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]time.Time{}
	}
	for _, p := range pipes {
		h.last[outbox.PipeSink(p)] = now
	}
}

// committed notes the commit time of a transaction read.
func (h *heartbeats) committed(t time.Time) {
	h.mu.Lock()
	h.sourceTime = t
	h.mu.Unlock()
}

// due reports whether sink, quiet since it was last seen (or since
// start), has waited every; it then counts as seen now.
func (h *heartbeats) due(sink string, every time.Duration, start time.Time) bool {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]time.Time{}
	}
	last, ok := h.last[sink]
	if !ok {
		last = start
	}
	if now.Sub(last) < every {
		return false
	}
	h.last[sink] = now
	return true
}

// runHeartbeats sends each sink with a heartbeat interval an "hb" record
// (canonical.MarshalHeartbeat) whenever no record was enqueued for it for
// that long. Only the replica holding the enqueue lease sends them: it
// knows the position read and what it enqueued. They go to the sink
// directly, not through the outbox: a heartbeat that fails is logged and
// replaced by the next one, never retried or dead-lettered.
func (e *Engine) runHeartbeats(ctx context.Context) {
	every := time.Duration(0)
	for _, se := range e.sinks {
		if hb := se.cfg.Heartbeat; hb > 0 && (every == 0 || hb < every) {
			every = hb
		}
	}
	if every == 0 {
		return
	}
	start := time.Now()
	_ = pause.Every(ctx, min(max(every/5, 20*time.Millisecond), time.Second), func() error {
		for name, se := range e.sinks {
			if se.cfg.Heartbeat > 0 && e.isLeader() && e.hb.due(name, se.cfg.Heartbeat, start) {
				e.sendHeartbeat(ctx, name, se)
			}
		}
		return nil
	})
}

func (e *Engine) isLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stream != nil
}

// sendHeartbeat delivers one heartbeat to the sink.
func (e *Engine) sendHeartbeat(ctx context.Context, name string, se sinkEntry) {
	e.mu.Lock()
	st := e.stream
	e.mu.Unlock()
	if st == nil {
		return
	}
	pos, info := st.Position(), st.Info()
	e.hb.mu.Lock()
	srcTime := e.hb.sourceTime
	e.hb.mu.Unlock()
	id := outbox.NewID()
	payload, err := canonical.MarshalHeartbeat(canonical.Heartbeat{
		Instance: e.cfg.Instance, Version: buildinfo.Version(), ServerID: info.ServerID,
		File: pos.File, Pos: pos.Pos, GTIDSet: pos.GTIDSet, SourceTime: srcTime, Time: time.Now(),
	}, id)
	var key string
	if err == nil {
		key, err = canonical.HeartbeatKey(e.cfg.Instance)
	}
	if err != nil {
		e.log.Error("encode heartbeat", zap.String("sink", name), zap.Error(err))
		return
	}
	rec := outbox.Record{
		ID: id, Sink: name, DB: canonical.HeartbeatDB, Table: canonical.HeartbeatTable,
		Pipe: e.cfg.Instance + ":" + canonical.HeartbeatDB + "." + canonical.HeartbeatTable + ":" + name,
		Op:   canonical.OpHeartbeat, Key: key, Payload: payload, Attempt: 1, CommitTime: srcTime,
	}
	dctx, cancel := context.WithTimeout(ctx, se.cfg.Timeout)
	defer cancel()
	errs := se.sink.Deliver(dctx, []outbox.Record{rec})
	err = nil
	if len(errs) > 0 {
		err = errs[0]
	}
	e.hb.mu.Lock()
	defer e.hb.mu.Unlock()
	if e.hb.failing == nil {
		e.hb.failing = map[string]bool{}
	}
	switch {
	case err != nil && !e.hb.failing[name] && ctx.Err() == nil:
		e.log.Warn("heartbeat not delivered; the next one follows in an interval", zap.String("sink", name), zap.Error(err))
		e.hb.failing[name] = true
	case err == nil && e.hb.failing[name]:
		e.log.Info("heartbeats delivered again", zap.String("sink", name))
		e.hb.failing[name] = false
	}
}
