package inspect

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/replay"
	"github.com/cdcout/cdcout/state"
)

// The reads below are what /v1/* and `cdcout status` show. Each is scoped to
// one instance: pipes named "<instance>:…", leases named "<kind>/<instance>"
// or "<kind>/<instance>:…", the checkpoint "enqueue/<instance>", and fleet
// rows whose payload names the instance. Two installations sharing one
// state database therefore never see each other's rows.
//
// A pipe's records are outbox rows (the slow path: retries and dead
// letters) and records still in segments (the fast path); every count adds
// both (outbox.Store.Backlogs, which also says what the reads cost).

// PipeStatus is one pipe's delivery state.
type PipeStatus struct {
	Pipe       string `json:"pipe"`
	Table      string `json:"table"`
	Sink       string `json:"sink"`
	Pending    int64  `json:"pending"`
	Delivering int64  `json:"delivering"`
	Delivered  int64  `json:"delivered"`
	Dead       int64  `json:"dead"`
	// OldestPendingAgeSeconds is how long the oldest undelivered record
	// (pending or delivering, as a row or in a segment) has been in the
	// outbox; 0 when none.
	OldestPendingAgeSeconds float64 `json:"oldestPendingAgeSeconds"`
	// DeliveryLagSeconds is how far delivery trails the source: now minus
	// the source commit time of the oldest undelivered record; 0 when
	// caught up.
	DeliveryLagSeconds float64 `json:"deliveryLagSeconds"`
	// LastError is the most recent error of a row not yet delivered
	// (retrying or dead), and when it happened.
	LastError   string     `json:"lastError,omitempty"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
	// DrainHolder holds the pipe's drain lease ("" when none is live).
	DrainHolder string `json:"drainHolder"`
	DrainEpoch  uint64 `json:"drainEpoch,omitempty"`
	// Paused: an operator paused the pipe's sink (cdcout sink pause); no
	// replica delivers its records until it is resumed.
	Paused bool `json:"paused,omitempty"`
	// Endpoint is this replica's view of the sink's receiver (webhooks):
	// its adaptive concurrency limit, requests in flight and latency.
	Endpoint *EndpointStatus `json:"endpoint,omitempty"`
}

// EndpointStatus is a sink endpoint's adaptive concurrency state as this
// replica sees it (every pipe of the sink shares it).
type EndpointStatus struct {
	Limit     int     `json:"limit"`
	Max       int     `json:"max"`
	InFlight  int     `json:"inFlight"`
	RTTMs     float64 `json:"rttMs"`
	FloorMs   float64 `json:"rttFloorMs"`
	PausedFor float64 `json:"pausedForSeconds,omitempty"`
	Overloads int64   `json:"overloads"`
}

// LeaseStatus is one lease row.
type LeaseStatus struct {
	Name             string     `json:"name"`
	Holder           string     `json:"holder"`
	Epoch            uint64     `json:"epoch"`
	Live             bool       `json:"live"`
	ExpiresAt        time.Time  `json:"expiresAt"`
	ExpiresInSeconds float64    `json:"expiresInSeconds"`
	AcquiredAt       *time.Time `json:"acquiredAt,omitempty"`
	RenewedAt        *time.Time `json:"renewedAt,omitempty"`
}

// Checkpoint is the instance's enqueue checkpoint.
type Checkpoint struct {
	Source     string          `json:"source"`
	Position   json.RawMessage `json:"position"`
	Epoch      uint64          `json:"epoch"`
	Holder     string          `json:"holder"`
	UpdatedAt  time.Time       `json:"updatedAt"`
	AgeSeconds float64         `json:"ageSeconds"`
}

// DeadRow is a dead-lettered row as GET /v1/dead and the dashboard list
// it.
type DeadRow = outbox.DeadRow

// EngineInfo is the payload a `cdcout run` replica writes as its fleet
// observation (kind fleet.KindEngine). Rows are scoped by Instance.
type EngineInfo struct {
	Instance string `json:"instance"`
	// Holder is the replica's lease holder id ("<replica-id>/<nonce>").
	Holder string `json:"holder,omitempty"`
	// Role is "leader" while it holds the enqueue lease, else "standby";
	// RoleStopped once it stopped.
	Role string `json:"role,omitempty"`
	// DrainLeases is how many drain leases it holds.
	DrainLeases int `json:"drainLeases"`
	// Sinks are the sinks it delivers to, with the tables each takes, so
	// that cdcout backfill can feed the pipes the fleet serves.
	Sinks []ServedSink `json:"sinks,omitempty"`
	// BinlogRunway is the leader's last binlog runway reading.
	BinlogRunway *binlog.Runway `json:"binlogRunway,omitempty"`
	// ReadsSegmentFormat is the newest outbox segment format the replica
	// reads (outbox.SegmentFormatRead); 0, from a release before it said,
	// means format 1 only.
	ReadsSegmentFormat int `json:"readsSegmentFormat,omitempty"`
	// SegmentFormat is the format the leader writes segments in, and why
	// (segment_format auto: the replica that holds it at 1).
	SegmentFormat       int    `json:"segmentFormat,omitempty"`
	SegmentFormatReason string `json:"segmentFormatReason,omitempty"`
}

// ServedSink is one sink a replica delivers to and what reaches it: the
// replica's capture patterns (--tables; empty: all), the sink's tables:
// filter and its ops (empty: all).
type ServedSink struct {
	Name    string   `json:"name"`
	Capture []string `json:"capture,omitempty"`
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	Ops     []string `json:"ops,omitempty"`
}

// Serves reports whether backfilled rows (inserts to a subscriber) of
// db.table reach the sink.
func (s ServedSink) Serves(db, table string) bool {
	if len(s.Ops) > 0 && !slices.Contains(s.Ops, "insert") {
		return false
	}
	if len(s.Capture) > 0 && !slices.ContainsFunc(s.Capture, func(p string) bool { return config.MatchTable(p, db, table) }) {
		return false
	}
	return config.TableFilter{Include: s.Include, Exclude: s.Exclude}.Matches(db, table)
}

// The roles a replica reports (EngineInfo.Role, SourceStatus.Role).
const (
	// RoleLeader holds the enqueue lease: it reads the binlog into the
	// outbox.
	RoleLeader = "leader"
	// RoleStandby follows the binlog into its handoff buffer, ready to
	// take over.
	RoleStandby = "standby"
	// RoleStopped is the role in the row a replica writes as it stops.
	// Such a replica is listed but no longer expected to answer.
	RoleStopped = "stopped"
)

// Fleet is the merged fleet view of one instance.
type Fleet = fleet.Result[EngineInfo]

// Status is everything `cdcout status` prints.
type Status struct {
	Instance   string        `json:"instance"`
	Checkpoint *Checkpoint   `json:"checkpoint"`
	Pipes      []PipeStatus  `json:"pipes"`
	Leases     []LeaseStatus `json:"leases"`
	Fleet      Fleet         `json:"fleet"`
	// BinlogRunway is the live leader's last runway reading (fleet row).
	BinlogRunway *RunwayView `json:"binlogRunway,omitempty"`
	// Replays are the running replays and the latest finished ones.
	Replays []replay.Status `json:"replays,omitempty"`
}

// Reader reads one instance's state from the state database.
type Reader struct {
	DB       *sql.DB
	Schema   string
	Instance string
	// StaleAfter is the fleet staleness threshold (default
	// fleet.DefaultStaleAfter).
	StaleAfter time.Duration
}

func (r Reader) table(name string) string { return state.Table(r.Schema, name) }

// store is the outbox of the state database; every read of outbox rows and
// segments goes through it.
func (r Reader) store() *outbox.Store { return outbox.NewStore(r.DB, r.Schema, nil) }

// pipePrefix starts the names of this instance's pipes.
func (r Reader) pipePrefix() string { return r.Instance + ":" }

// Pipes returns the status of every pipe of the instance that has rows or
// segments, plus the names in extra (configured pipes without any yet), by
// name. Counts are of records (see backlogs).
func (r Reader) Pipes(ctx context.Context, extra ...string) ([]PipeStatus, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	byPipe := map[string]*PipeStatus{}
	get := func(pipe string) *PipeStatus {
		p := byPipe[pipe]
		if p == nil {
			p = &PipeStatus{Pipe: pipe}
			p.Table, p.Sink = splitPipe(r.Instance, pipe)
			byPipe[pipe] = p
		}
		return p
	}
	for _, e := range extra {
		if strings.HasPrefix(e, r.Instance+":") {
			get(e)
		}
	}
	st := r.store()
	backlogs, err := st.Backlogs(ctx, r.pipePrefix())
	if err != nil {
		return nil, err
	}
	for pipe, b := range backlogs {
		p := get(pipe)
		p.Pending, p.Delivering, p.Delivered, p.Dead = b.Pending, b.Delivering, b.Delivered, b.Dead
		p.OldestPendingAgeSeconds = b.OldestAge.Seconds()
		p.DeliveryLagSeconds = b.Lag.Seconds()
	}
	lastErrors, err := st.LastErrors(ctx, r.pipePrefix())
	if err != nil {
		return nil, err
	}
	for pipe, e := range lastErrors {
		p := get(pipe)
		p.LastError, p.LastErrorAt = e.Error, timePtr(e.At)
	}

	leases, err := r.Leases(ctx)
	if err != nil {
		return nil, err
	}
	for _, l := range leases {
		if pipe, ok := strings.CutPrefix(l.Name, "drain/"); ok && l.Live {
			if p := byPipe[pipe]; p != nil {
				p.DrainHolder, p.DrainEpoch = l.Holder, l.Epoch
			}
		}
	}

	if err := r.markPaused(ctx, byPipe); err != nil {
		return nil, err
	}
	out := make([]PipeStatus, 0, len(byPipe))
	for _, p := range byPipe {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pipe < out[j].Pipe })
	return out, nil
}

// OutboxStats counts the instance's outbox records by pipe and status
// (pending, delivering, delivered, dead; see backlogs), with the oldest
// undelivered record's age on the "pending" stat; it feeds
// metrics.WatchOutbox.
func (r Reader) OutboxStats(ctx context.Context) ([]metrics.OutboxStat, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	backlogs, err := r.store().Backlogs(ctx, r.pipePrefix())
	if err != nil {
		return nil, err
	}
	var out []metrics.OutboxStat
	for pipe, b := range backlogs {
		// A pipe whose only undelivered records are being delivered still
		// has an oldest undelivered record: it is reported on a zero
		// "pending" stat.
		if b.Pending > 0 || b.Undelivered {
			out = append(out, metrics.OutboxStat{Pipe: pipe, Status: metrics.OutboxPending, Records: b.Pending, OldestPendingAge: b.OldestAge})
		}
		for _, s := range []metrics.OutboxStat{
			{Pipe: pipe, Status: metrics.OutboxDelivering, Records: b.Delivering},
			{Pipe: pipe, Status: metrics.OutboxDelivered, Records: b.Delivered},
			{Pipe: pipe, Status: metrics.OutboxDead, Records: b.Dead},
		} {
			if s.Records > 0 {
				out = append(out, s)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pipe != out[j].Pipe {
			return out[i].Pipe < out[j].Pipe
		}
		return out[i].Status < out[j].Status
	})
	return out, nil
}

// Leases returns the instance's leases by name.
func (r Reader) Leases(ctx context.Context) ([]LeaseStatus, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	esc := state.EscapeLike(r.Instance)
	out, err := state.Collect(ctx, r.DB, `SELECT name, holder, epoch, expires_at, acquired_at, renewed_at,
  expires_at > NOW(6), TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)
FROM `+r.table("leases")+` WHERE name LIKE ? OR name LIKE ? ORDER BY name`, []any{"%/" + esc, "%/" + esc + ":%"},
		func(rows *sql.Rows) (LeaseStatus, error) {
			var (
				l             LeaseStatus
				exp, acq, ren sqlTime
				in            int64
			)
			err := rows.Scan(&l.Name, &l.Holder, &l.Epoch, &exp, &acq, &ren, &l.Live, &in)
			l.ExpiresAt, l.AcquiredAt, l.RenewedAt = exp.T, timePtr(acq.T), timePtr(ren.T)
			l.ExpiresInSeconds = float64(in) / 1e6
			return l, err
		})
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	if out == nil {
		out = []LeaseStatus{} // JSON [], not null
	}
	return out, nil
}

// Checkpoint returns the instance's enqueue checkpoint, or nil before the
// first one is written.
func (r Reader) Checkpoint(ctx context.Context) (*Checkpoint, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	var (
		c   Checkpoint
		pos string
		at  sqlTime
		age int64
	)
	c.Source = "enqueue/" + r.Instance
	err := r.DB.QueryRowContext(ctx, `SELECT position, epoch, holder, updated_at, TIMESTAMPDIFF(MICROSECOND, updated_at, NOW(6))
FROM `+r.table("checkpoints")+` WHERE source = ?`, c.Source).Scan(&pos, &c.Epoch, &c.Holder, &at, &age)
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	if json.Valid([]byte(pos)) {
		c.Position = json.RawMessage(pos)
	} else {
		c.Position, _ = json.Marshal(pos)
	}
	c.UpdatedAt, c.AgeSeconds = at.T, float64(age)/1e6
	return &c, nil
}

// Fleet returns the merged fleet view of the instance's engine replicas.
func (r Reader) Fleet(ctx context.Context) (Fleet, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return Fleet{}, err
	}
	all, err := fleet.Read(ctx, r.DB, r.Schema, fleet.KindEngine)
	if err != nil {
		return Fleet{}, err
	}
	rows, running := InstanceRows(all, r.Instance)
	// A stopped replica's row does not make it a member (expected to
	// answer); a live lease it still holds would.
	members, err := fleet.Members(ctx, r.DB, r.Schema, r.Instance, running, r.StaleAfter)
	if err != nil {
		return Fleet{}, err
	}
	return fleet.Merge[EngineInfo](rows, members, r.StaleAfter), nil
}

// InstanceRows are the engine fleet rows of instance, and of them those
// of replicas not stopped. Rows whose payload does not decode stay in
// both: the fleet view reports them as unreadable, and segment_format
// auto holds at format 1 for them, rather than this filter hiding them.
func InstanceRows(all []fleet.Row, instance string) (rows, running []fleet.Row) {
	for _, row := range all {
		var info EngineInfo
		decoded := len(row.Payload) > 0 && json.Unmarshal(row.Payload, &info) == nil
		if decoded && info.Instance != instance {
			continue
		}
		rows = append(rows, row)
		if !decoded || info.Role != RoleStopped {
			running = append(running, row)
		}
	}
	return rows, running
}

// rowKeyShown bounds the row key a dead row shows (a key of wide
// columns can be long).
const rowKeyShown = 200

// Dead returns up to limit dead rows of the instance, newest first.
func (r Reader) Dead(ctx context.Context, limit int) ([]DeadRow, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 1000 {
		limit = 50
	}
	return r.store().DeadRows(ctx, outbox.DeadQuery{Prefix: r.pipePrefix(), NewestFirst: true, Limit: limit, KeyChars: rowKeyShown})
}

// Status reads everything `cdcout status` shows.
func (r Reader) Status(ctx context.Context) (Status, error) {
	st := Status{Instance: r.Instance}
	var err error
	if st.Checkpoint, err = r.Checkpoint(ctx); err != nil {
		return st, err
	}
	if st.Pipes, err = r.Pipes(ctx); err != nil {
		return st, err
	}
	if st.Leases, err = r.Leases(ctx); err != nil {
		return st, err
	}
	if st.Fleet, err = r.Fleet(ctx); err != nil {
		return st, err
	}
	st.BinlogRunway = fleetRunway(st.Fleet, time.Now())
	st.Replays, err = r.Replays(ctx)
	return st, err
}

// splitPipe splits "<instance>:<db.table>:<sink>" into table and sink.
func splitPipe(instance, pipe string) (table, sink string) {
	if _, table, sink, ok := outbox.SplitPipe(pipe); ok {
		return table, sink
	}
	return strings.TrimPrefix(pipe, instance+":"), ""
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// sqlTime is state.Time: scans DATETIME columns with or without parseTime.
type sqlTime = state.Time
