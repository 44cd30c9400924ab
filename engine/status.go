package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/outbox"
)

// writeFailure is the first of a run of failed attempts of one write.
type writeFailure struct {
	since time.Time
	err   string
}

// noteWrite records the outcome of one attempt of a state write.
func (e *Engine) noteWrite(what string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		delete(e.writeFails, what)
		return
	}
	if e.writeFails == nil {
		e.writeFails = map[string]writeFailure{}
	}
	f, ok := e.writeFails[what]
	if !ok {
		f.since = time.Now()
	}
	f.err = err.Error()
	e.writeFails[what] = f
}

// ready is /readyz's engine check: unready while a state write this
// replica needs keeps failing (grants revoked, read-only, full disk), with
// what failed, since when and why. A ping alone would pass all of these.
func (e *Engine) ready() (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.writeFails) == 0 {
		return true, ""
	}
	whats := make([]string, 0, len(e.writeFails))
	for w := range e.writeFails {
		whats = append(whats, w)
	}
	sort.Strings(whats)
	var b strings.Builder
	b.WriteString("state database refuses writes: ")
	for i, w := range whats {
		if i > 0 {
			b.WriteString("; ")
		}
		f := e.writeFails[w]
		fmt.Fprintf(&b, "%s failing for %s: %s", w, time.Since(f.since).Round(time.Second), f.err)
	}
	return false, b.String()
}

// secrets lists what the inspect server must never echo.
func (e *Engine) secrets() []string {
	var out []string
	if t := e.cfg.AdminTokenValue(); t != "" {
		out = append(out, t.Value())
	}
	for _, dsn := range []config.DSN{e.cfg.DSN, e.cfg.StateDSN} {
		if mc, err := mysql.ParseDSN(dsn.Value()); err == nil && mc.Passwd != "" {
			out = append(out, mc.Passwd)
		}
	}
	for _, s := range e.cfg.Sinks {
		for _, sec := range []config.Secret{s.Secret, s.HashKeyValue()} {
			if sec != "" {
				out = append(out, sec.Value())
			}
		}
		for _, h := range s.Headers {
			out = append(out, h.Value())
		}
		if s.Kafka != nil && s.Kafka.SASL != nil && s.Kafka.SASL.Password != "" {
			out = append(out, s.Kafka.SASL.Password.Value())
		}
		if s.NATS != nil {
			for _, sec := range []config.Secret{s.NATS.Password, s.NATS.Token} {
				if sec != "" {
					out = append(out, sec.Value())
				}
			}
		}
	}
	return out
}

// observeEvent counts a change read by the leader and, at a commit,
// records how far behind the source it is (commit time → now; the commit
// time has the binlog header's whole-second resolution).
func (e *Engine) observeEvent(ev binlog.Event) {
	if ch := ev.Change; ch != nil {
		if ch.Op != canonical.OpDDL { // a statement, not a row change
			e.metrics.ObserveChange(ch.Source.DB, ch.Source.Table, string(ch.Op))
		}
		return
	}
	if ev.Commit == nil || ev.Commit.Time.IsZero() {
		return
	}
	now := time.Now()
	lag := max(now.Sub(ev.Commit.Time), 0)
	e.mu.Lock()
	e.lag, e.lastEventAt = lag, now
	e.hb.committed(ev.Commit.Time)
	st := e.stream
	e.mu.Unlock()
	e.metrics.SetSourceLag(lag)
	if st != nil {
		e.metrics.SetPreparedXA(st.PreparedXA())
	}
}

// sourceStatus reports the binlog source to the inspect server.
func (e *Engine) sourceStatus() inspect.SourceStatus {
	e.mu.Lock()
	st, digest, lag, lastEventAt := e.stream, e.digest, e.lag, e.lastEventAt
	e.mu.Unlock()
	if st == nil {
		return inspect.SourceStatus{Following: true, Role: inspect.RoleStandby, DSN: e.cfg.DSN.String()}
	}

	info := st.Info()
	mode := "gtid"
	if digest {
		mode = "digest"
	}
	// Connected and lag follow the stream's last contact with the server
	// (heartbeats count), not the existence of a stream object: while the
	// link is down the lag keeps growing by the silence, so the stall
	// check and cdcout_source_lag_seconds see an outage too.
	h := st.Health()
	if !h.Connected && !h.LastContact.IsZero() {
		lag += time.Since(h.LastContact)
	}
	xa, xaSince := st.PreparedXA()
	runway, runwayErr := e.runway.get()
	return inspect.SourceStatus{
		Connected: h.Connected, Role: inspect.RoleLeader, Position: st.Position(), IdentityMode: mode,
		Lag: lag, LastEventAt: lastEventAt, LastContactAt: h.LastContact, Error: h.Error,
		Flavor: info.Flavor, ServerVersion: info.Version, MetadataMode: info.MetadataMode,
		DSN:        e.cfg.DSN.String(),
		PreparedXA: xa, PreparedXASince: xaSince,
		Runway: runway, RunwayError: runwayErr,
	}
}

// heartbeatEvery is how often the fleet observation is written: the
// fleet default, or faster with a short lease TTL.
func heartbeatEvery(ttl time.Duration) time.Duration {
	return max(min(fleet.DefaultWriteEvery, 2*ttl), time.Second)
}

// droppedPending is what the handoff buffers could not carry.
func (e *Engine) droppedPending() int64 {
	e.mu.Lock()
	ho, n := e.ho, e.droppedBefore
	e.mu.Unlock()
	if ho != nil {
		n += ho.droppedPending()
	}
	return n
}

func (e *Engine) reportDropped() {
	n := e.droppedPending()
	e.mu.Lock()
	d := n - e.droppedReported
	e.droppedReported = n
	e.mu.Unlock()
	if d > 0 {
		e.metrics.AddHandoffDroppedPending(d)
	}
}

// servedSinks says which sinks this replica delivers to and what reaches
// each (names and table patterns only: never a URL, which may hold a
// credential).
func (e *Engine) servedSinks() []inspect.ServedSink {
	out := make([]inspect.ServedSink, 0, len(e.cfg.Sinks))
	for _, s := range e.cfg.Sinks {
		out = append(out, inspect.ServedSink{Name: s.Name, Capture: e.cfg.Tables, Include: s.Tables.Include, Exclude: s.Tables.Exclude, Ops: s.Ops})
	}
	return out
}

// stoppedObservation is the fleet row a stopping replica leaves behind:
// role "stopped", no drain leases.
func (e *Engine) stoppedObservation() fleet.Observation {
	o := e.observation()
	if info, ok := o.Payload.(inspect.EngineInfo); ok {
		info.Role, info.DrainLeases = inspect.RoleStopped, 0
		o.Payload = info
	}
	return o
}

// observation is this replica's fleet row.
func (e *Engine) observation() fleet.Observation {
	e.mu.Lock()
	role, dl, segFmt, segFmtWhy := e.role, e.dl, e.segFmt, e.segFmtWhy
	e.mu.Unlock()
	n := 0
	if dl != nil {
		n = dl.count()
	}
	reach := ""
	if host, _, ok := strings.Cut(e.cfg.HTTPAddr, ":"); ok && host != "" && host != "0.0.0.0" && host != "[::]" {
		reach = e.cfg.HTTPAddr
	}
	runway, _ := e.runway.get()
	return fleet.Observation{
		ReplicaID: e.cfg.ReplicaID, Kind: fleet.KindEngine, StartedAt: e.started, Version: buildinfo.Version(),
		Payload: inspect.EngineInfo{Instance: e.cfg.Instance, Holder: e.holder, Role: role, DrainLeases: n, Sinks: e.servedSinks(), BinlogRunway: runway,
			ReadsSegmentFormat: outbox.SegmentFormatRead, SegmentFormat: segFmt, SegmentFormatReason: segFmtWhy},
		ReachableAt: reach,
	}
}

// Stats are counters of the current tenure, for tests and logs.
type Stats struct {
	RecordsWritten int64
	Batches        int64
	// EnqueueTime is the time spent in outbox enqueue transactions;
	// EnqueueWait the part of it the stream's handler waited for (the
	// rest overlapped with reading the next batch).
	EnqueueTime, EnqueueWait time.Duration
	// Buffered is the records read but not yet written (the batch in
	// flight included); Unwritten reports a commit whose checkpoint is not
	// written yet. MaxBuffered is the peak of the records buffered beside
	// the batch in flight (bounded by enqueue_max_buffer plus one change's
	// fan-out); with the batch in flight, at most twice that is held.
	Buffered, MaxBuffered int
	Unwritten             bool
}

// Stats returns the current enqueue counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	q := e.enq
	e.mu.Unlock()
	if q == nil {
		return Stats{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st := Stats{
		RecordsWritten: q.recordsWritten, Batches: q.flushes, EnqueueTime: q.flushTime, EnqueueWait: q.waitTime,
		Buffered: len(q.ready) + len(q.open), MaxBuffered: q.maxBuffered, Unwritten: q.cp != nil,
	}
	for _, b := range q.inflight {
		st.Buffered += len(b.items)
		st.Unwritten = st.Unwritten || b.cp != nil
	}
	return st
}

// Kinds of state writes readiness watches.
const (
	writeEnqueueLease = "enqueue lease"
	writeRenewal      = "enqueue lease renewal"
	writeEnqueue      = "enqueue (outbox rows and checkpoint)"
	writeMember       = "member lease"
)
