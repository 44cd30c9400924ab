package inspect

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/state"
)

// The reads below are what /v1/* and `cdcout status` show. Each is scoped to
// one instance: pipes named "<instance>:…", leases named "<kind>/<instance>"
// or "<kind>/<instance>:…", the checkpoint "enqueue/<instance>", and fleet
// rows whose payload names the instance. Two installations sharing one
// state database therefore never see each other's rows.
//
// A pipe's records are outbox rows (the slow path: retries and dead
// letters) and records still in segments (the fast path), and every count
// below adds both. Counting rows touches only the outbox's `due` index
// (pipe, status, …); the other row aggregates read undelivered rows only,
// which a healthy outbox has few of. Segments are one per enqueued
// transaction and pipe: their record counts are read from the segments
// themselves over the fifo index (pipe, status, id, records). A dashboard polling
// every two seconds stays cheap even with millions of delivered records
// kept for retention.

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

// DeadRow is a dead-lettered row as the dashboard lists it.
type DeadRow struct {
	ID    string `json:"id"`
	Pipe  string `json:"pipe"`
	Table string `json:"table"`
	// RowKey is the row's key as JSON ({"id":42}), cut to rowKeyShown.
	RowKey      string     `json:"rowKey"`
	Op          string     `json:"op"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"lastError"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
}

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

// RoleStopped is the role in the row a replica writes as it stops. Such a
// replica is listed but no longer expected to answer.
const RoleStopped = "stopped"

// Fleet is the merged fleet view of one instance.
type Fleet = fleet.Result[EngineInfo]

// Status is everything `cdcout status` prints.
type Status struct {
	Instance   string        `json:"instance"`
	Checkpoint *Checkpoint   `json:"checkpoint"`
	Pipes      []PipeStatus  `json:"pipes"`
	Leases     []LeaseStatus `json:"leases"`
	Fleet      Fleet         `json:"fleet"`
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

// pipeLike matches this instance's pipes.
func (r Reader) pipeLike() string { return escapeLike(r.Instance) + ":%" }

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
	backlogs, err := r.backlogs(ctx)
	if err != nil {
		return nil, err
	}
	for pipe, b := range backlogs {
		p := get(pipe)
		p.Pending, p.Delivering, p.Delivered, p.Dead = b.pending, b.delivering, b.delivered, b.dead
		p.OldestPendingAgeSeconds = micros(b.oldest)
		p.DeliveryLagSeconds = micros(b.lag)
	}

	// A pipe's last error: a segment held whole (the sink failed every
	// record tried) holds the pipe up, so its error comes first; otherwise
	// the rows' (a record that failed left its segment as a row).
	for _, e := range []struct{ what, q string }{
		{"read held segments", `SELECT pipe, last_error, last_error_at FROM ` + r.table("segments") + `
WHERE pipe LIKE ? AND status = 'pending' AND last_error_at IS NOT NULL ORDER BY last_error_at DESC`},
		{"read pipe errors", `SELECT o.pipe, o.last_error, o.last_error_at
FROM ` + r.table("outbox") + ` o JOIN (
  SELECT pipe, MAX(last_error_at) AS m FROM ` + r.table("outbox") + `
  WHERE pipe LIKE ? AND status <> 'delivered' AND last_error_at IS NOT NULL GROUP BY pipe
) x ON o.pipe = x.pipe AND o.last_error_at = x.m
WHERE o.status <> 'delivered'`},
	} {
		rows, err := r.DB.QueryContext(ctx, e.q, r.pipeLike())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.what, err)
		}
		for rows.Next() {
			var pipe string
			var msg sql.NullString
			var at sqlTime
			if err := rows.Scan(&pipe, &msg, &at); err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", e.what, err)
			}
			if p := get(pipe); p.LastErrorAt == nil {
				p.LastError, p.LastErrorAt = msg.String, timePtr(at.T)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", e.what, err)
		}
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
	backlogs, err := r.backlogs(ctx)
	if err != nil {
		return nil, err
	}
	var out []metrics.OutboxStat
	for pipe, b := range backlogs {
		// A pipe whose only undelivered records are being delivered still
		// has an oldest undelivered record: it is reported on a zero
		// "pending" stat.
		if b.pending > 0 || b.oldest.Valid {
			out = append(out, metrics.OutboxStat{Pipe: pipe, Status: "pending", Rows: b.pending,
				OldestPendingAge: time.Duration(max(b.oldest.Int64, 0)) * time.Microsecond})
		}
		for _, s := range []metrics.OutboxStat{
			{Pipe: pipe, Status: "delivering", Rows: b.delivering},
			{Pipe: pipe, Status: "delivered", Rows: b.delivered},
			{Pipe: pipe, Status: "dead", Rows: b.dead},
		} {
			if s.Rows > 0 {
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

// backlog is one pipe's records by state, rows and segment records added.
type backlog struct {
	// pending counts undelivered records not being delivered; delivering
	// those claimed by a drainer whose claim has not lapsed.
	pending, delivering, delivered, dead int64
	// oldest and lag are the microseconds since the oldest undelivered
	// record was enqueued and committed at the source; not Valid when
	// there is none.
	oldest, lag sql.NullInt64
}

// backlogs counts the instance's records per pipe. A record is an outbox
// row or a record still in a segment:
//
//   - a pending segment's records are pending, or delivering while the
//     segment is claimed (claimer set, claim not lapsed);
//   - a done segment's records were delivered, except those that left it
//     as outbox rows (a failure, a key blocked by a retry, a stop), which
//     count in their row's status instead. The rows that left a done
//     segment are counted as the rows whose id is at or above the pipe's
//     oldest done segment's id: rows are only ever written from done
//     segments (or before segments existed, with older ids), a pipe's
//     segments are done in id order and deleted by retention in that
//     order, and a row's id is its record's id in the segment. So the
//     subtraction is exact unless ids of a pipe's segments interleave
//     (two leaders enqueueing at once, each with its own clock), where
//     delivered is off by the rows concerned. It never goes below zero.
func (r Reader) backlogs(ctx context.Context) (map[string]*backlog, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	out := map[string]*backlog{}
	// The pipes first, a loose scan of each index's first column: with
	// "pipe IN (…) AND status = …" the queries below read only the entries
	// of that status in the (pipe, status, …) indexes, where "pipe LIKE ?"
	// would read every entry of the instance's pipes.
	pipes, err := state.Strings(ctx, r.DB, `SELECT DISTINCT pipe FROM `+r.table("outbox")+` WHERE pipe LIKE ?
UNION SELECT DISTINCT pipe FROM `+r.table("segments")+` WHERE pipe LIKE ?`, r.pipeLike(), r.pipeLike())
	if err != nil {
		return nil, fmt.Errorf("list pipes: %w", err)
	}
	if len(pipes) == 0 {
		return out, nil
	}
	in := "pipe IN (" + state.Placeholders(len(pipes)) + ")"
	args := make([]any, len(pipes))
	for i, p := range pipes {
		args[i] = p
	}
	// query runs q and hands each result row's backlog (by its first
	// column, the pipe) to row, the other columns scanned into dest.
	query := func(what, q string, args []any, dest []any, row func(b *backlog)) error {
		rows, err := r.DB.QueryContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer rows.Close()
		var pipe string
		for rows.Next() {
			if err := rows.Scan(append([]any{&pipe}, dest...)...); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			b := out[pipe]
			if b == nil {
				b = &backlog{}
				out[pipe] = b
			}
			row(b)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	older := func(a, b sql.NullInt64) sql.NullInt64 {
		if !a.Valid || b.Valid && b.Int64 > a.Int64 {
			return b
		}
		return a
	}
	var (
		status   string
		n, m     int64
		age, lag sql.NullInt64
		twice    = append(append([]any{}, args...), args...)
	)

	// Rows by status, and how many of them left a segment still kept (see
	// above). The derived table is one probe of the fifo index per pipe
	// (MIN(id) of a (pipe, status) prefix); the count stays a scan of the
	// due index.
	if err := query("count outbox rows", `SELECT o.pipe, o.status, COUNT(*), COALESCE(SUM(o.id >= s.first), 0)
FROM `+r.table("outbox")+` o LEFT JOIN (
  SELECT pipe, MIN(id) AS first FROM `+r.table("segments")+` WHERE `+in+` AND status = 'done' GROUP BY pipe
) s ON s.pipe = o.pipe
WHERE o.`+in+` GROUP BY o.pipe, o.status`, twice, []any{&status, &n, &m}, func(b *backlog) {
		switch status {
		case "pending":
			b.pending += n
		case "delivered":
			b.delivered += n
		case "dead":
			b.dead += n
		}
		b.delivered -= m
	}); err != nil {
		return nil, err
	}
	// A claimed ("delivering") row is a pending row with a claimer whose
	// next attempt is the claim's expiry: a short range of the due index.
	if err := query("count claimed outbox rows", `SELECT pipe, COUNT(*) FROM `+r.table("outbox")+`
WHERE `+in+` AND status = 'pending' AND next_attempt_at > NOW(6) AND claimer <> 0 GROUP BY pipe`, args, []any{&n}, func(b *backlog) {
		b.pending -= n
		b.delivering += n
	}); err != nil {
		return nil, err
	}
	if err := query("read oldest pending row", `SELECT pipe,
  TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)),
  TIMESTAMPDIFF(MICROSECOND, MIN(commit_ts), NOW(6))
FROM `+r.table("outbox")+` WHERE `+in+` AND status = 'pending' GROUP BY pipe`, args, []any{&age, &lag}, func(b *backlog) {
		b.oldest, b.lag = older(b.oldest, age), older(b.lag, lag)
	}); err != nil {
		return nil, err
	}
	// Pending segments are few: a healthy pipe has one or none.
	if err := query("count pending segment records", `SELECT pipe, SUM(records),
  SUM(IF(claimer <> 0 AND next_attempt_at > NOW(6), records, 0)),
  TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)),
  TIMESTAMPDIFF(MICROSECOND, MIN(first_commit_ts), NOW(6))
FROM `+r.table("segments")+` WHERE `+in+` AND status = 'pending' GROUP BY pipe`, args, []any{&n, &m, &age, &lag}, func(b *backlog) {
		b.pending += n - m
		b.delivering += m
		b.oldest, b.lag = older(b.oldest, age), older(b.lag, lag)
	}); err != nil {
		return nil, err
	}
	// Done segments are all those of the retention; records is in the fifo
	// index (pipe, status, id, records), so the sum reads only the index.
	if err := query("count delivered segment records", `SELECT pipe, SUM(records) FROM `+r.table("segments")+`
WHERE `+in+` AND status = 'done' GROUP BY pipe`, args, []any{&n}, func(b *backlog) {
		b.delivered += n
	}); err != nil {
		return nil, err
	}
	for _, b := range out {
		b.delivered = max(b.delivered, 0)
	}
	return out, nil
}

// Leases returns the instance's leases by name.
func (r Reader) Leases(ctx context.Context) ([]LeaseStatus, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	esc := escapeLike(r.Instance)
	rows, err := r.DB.QueryContext(ctx, `SELECT name, holder, epoch, expires_at, acquired_at, renewed_at,
  expires_at > NOW(6), TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)
FROM `+r.table("leases")+` WHERE name LIKE ? OR name LIKE ? ORDER BY name`, "%/"+esc, "%/"+esc+":%")
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	defer rows.Close()
	out := []LeaseStatus{}
	for rows.Next() {
		var (
			l             LeaseStatus
			exp, acq, ren sqlTime
			in            int64
		)
		if err := rows.Scan(&l.Name, &l.Holder, &l.Epoch, &exp, &acq, &ren, &l.Live, &in); err != nil {
			return nil, fmt.Errorf("read leases: %w", err)
		}
		l.ExpiresAt, l.AcquiredAt, l.RenewedAt = exp.T, timePtr(acq.T), timePtr(ren.T)
		l.ExpiresInSeconds = float64(in) / 1e6
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
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
	var rows, running []fleet.Row
	for _, row := range all {
		var info EngineInfo
		decoded := len(row.Payload) > 0 && json.Unmarshal(row.Payload, &info) == nil
		if decoded && info.Instance != r.Instance {
			continue
		}
		// Undecodable payloads stay in: Merge reports them as unreadable
		// (their member missing) rather than this filter hiding them.
		rows = append(rows, row)
		if !decoded || info.Role != RoleStopped {
			running = append(running, row)
		}
	}
	// A stopped replica's row does not make it a member (expected to
	// answer); a live lease it still holds would.
	members, err := fleet.Members(ctx, r.DB, r.Schema, r.Instance, running, r.StaleAfter)
	if err != nil {
		return Fleet{}, err
	}
	return fleet.Merge[EngineInfo](rows, members, r.StaleAfter), nil
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
	rows, err := r.DB.QueryContext(ctx, `SELECT id, pipe, db, tbl, LEFT(row_key, `+strconv.Itoa(rowKeyShown)+`), op, attempts, last_error, last_error_at
FROM `+r.table("outbox")+` WHERE status = 'dead' AND pipe LIKE ?
ORDER BY created_at DESC, id DESC LIMIT ?`, r.pipeLike(), limit)
	if err != nil {
		return nil, fmt.Errorf("list dead rows: %w", err)
	}
	defer rows.Close()
	out := []DeadRow{}
	for rows.Next() {
		var (
			d       DeadRow
			db, tbl string
			msg     sql.NullString
			at      sqlTime
		)
		if err := rows.Scan(&d.ID, &d.Pipe, &db, &tbl, &d.RowKey, &d.Op, &d.Attempts, &msg, &at); err != nil {
			return nil, fmt.Errorf("list dead rows: %w", err)
		}
		d.Table, d.LastError, d.LastErrorAt = db+"."+tbl, msg.String, timePtr(at.T)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead rows: %w", err)
	}
	return out, nil
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
	return st, nil
}

// splitPipe splits "<instance>:<db.table>:<sink>" into table and sink.
func splitPipe(instance, pipe string) (table, sink string) {
	rest := strings.TrimPrefix(pipe, instance+":")
	if i := strings.LastIndex(rest, ":"); i >= 0 {
		return rest[:i], rest[i+1:]
	}
	return rest, ""
}

func escapeLike(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

func micros(v sql.NullInt64) float64 {
	if !v.Valid || v.Int64 < 0 {
		return 0
	}
	return float64(v.Int64) / 1e6
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// sqlTime is state.Time: scans DATETIME columns with or without parseTime.
type sqlTime = state.Time
