package inspect

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

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
// Counting touches only the outbox's `due` index (pipe, status, …); the
// other aggregates read undelivered rows only, which a healthy outbox has
// few of, so a dashboard polling every two seconds stays cheap even with
// millions of delivered rows kept for retention.

// PipeStatus is one pipe's delivery state.
type PipeStatus struct {
	Pipe       string `json:"pipe"`
	Table      string `json:"table"`
	Sink       string `json:"sink"`
	Pending    int64  `json:"pending"`
	Delivering int64  `json:"delivering"`
	Delivered  int64  `json:"delivered"`
	Dead       int64  `json:"dead"`
	// OldestPendingAgeSeconds is how long the oldest undelivered row
	// (pending or delivering) has been in the outbox; 0 when none.
	OldestPendingAgeSeconds float64 `json:"oldestPendingAgeSeconds"`
	// DeliveryLagSeconds is how far delivery trails the source: now minus
	// the source commit time of the oldest undelivered row; 0 when caught up.
	DeliveryLagSeconds float64 `json:"deliveryLagSeconds"`
	// LastError is the most recent error of a row not yet delivered
	// (retrying or dead), and when it happened.
	LastError   string     `json:"lastError,omitempty"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
	// DrainHolder holds the pipe's drain lease ("" when none is live).
	DrainHolder string `json:"drainHolder"`
	DrainEpoch  uint64 `json:"drainEpoch,omitempty"`
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
	ID          string     `json:"id"`
	Pipe        string     `json:"pipe"`
	Table       string     `json:"table"`
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
	// Role is "leader" while it holds the enqueue lease, else "standby".
	Role string `json:"role,omitempty"`
	// DrainLeases is how many drain leases it holds.
	DrainLeases int `json:"drainLeases"`
}

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

// Pipes returns the status of every pipe of the instance that has rows,
// plus the names in extra (configured pipes without rows yet), by name.
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
	stats, err := r.OutboxStats(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range stats {
		p := get(s.Pipe)
		switch s.Status {
		case "pending":
			p.Pending = s.Rows
		case "delivering":
			p.Delivering = s.Rows
		case "delivered":
			p.Delivered = s.Rows
		case "dead":
			p.Dead = s.Rows
		}
	}

	rows, err := r.DB.QueryContext(ctx, `SELECT pipe,
  TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)),
  TIMESTAMPDIFF(MICROSECOND, MIN(commit_ts), NOW(6))
FROM `+r.table("outbox")+` WHERE pipe LIKE ? AND status = 'pending' GROUP BY pipe`, r.pipeLike())
	if err != nil {
		return nil, fmt.Errorf("read pipe backlog: %w", err)
	}
	for rows.Next() {
		var pipe string
		var age, lag sql.NullInt64
		if err := rows.Scan(&pipe, &age, &lag); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read pipe backlog: %w", err)
		}
		p := get(pipe)
		p.OldestPendingAgeSeconds = micros(age)
		p.DeliveryLagSeconds = micros(lag)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pipe backlog: %w", err)
	}

	rows, err = r.DB.QueryContext(ctx, `SELECT o.pipe, o.last_error, o.last_error_at
FROM `+r.table("outbox")+` o JOIN (
  SELECT pipe, MAX(last_error_at) AS m FROM `+r.table("outbox")+`
  WHERE pipe LIKE ? AND status <> 'delivered' AND last_error_at IS NOT NULL GROUP BY pipe
) x ON o.pipe = x.pipe AND o.last_error_at = x.m
WHERE o.status <> 'delivered'`, r.pipeLike())
	if err != nil {
		return nil, fmt.Errorf("read pipe errors: %w", err)
	}
	for rows.Next() {
		var pipe string
		var msg sql.NullString
		var at sqlTime
		if err := rows.Scan(&pipe, &msg, &at); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read pipe errors: %w", err)
		}
		if p := get(pipe); p.LastErrorAt == nil {
			p.LastError, p.LastErrorAt = msg.String, timePtr(at.T)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pipe errors: %w", err)
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

	out := make([]PipeStatus, 0, len(byPipe))
	for _, p := range byPipe {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pipe < out[j].Pipe })
	return out, nil
}

// OutboxStats counts the instance's outbox rows by pipe and status, with
// the oldest undelivered row's age on the "pending" stat; it feeds
// metrics.WatchOutbox.
func (r Reader) OutboxStats(ctx context.Context) ([]metrics.OutboxStat, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	rows, err := r.DB.QueryContext(ctx, `SELECT pipe, status, COUNT(*) FROM `+r.table("outbox")+`
WHERE pipe LIKE ? GROUP BY pipe, status`, r.pipeLike())
	if err != nil {
		return nil, fmt.Errorf("count outbox rows: %w", err)
	}
	defer rows.Close()
	var out []metrics.OutboxStat
	for rows.Next() {
		var s metrics.OutboxStat
		if err := rows.Scan(&s.Pipe, &s.Status, &s.Rows); err != nil {
			return nil, fmt.Errorf("count outbox rows: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count outbox rows: %w", err)
	}
	rows.Close()
	// A claimed ("delivering") row is a pending row with a claimer whose
	// next attempt is the claim's expiry: a short range of the due index.
	claimed, err := r.DB.QueryContext(ctx, `SELECT pipe, COUNT(*) FROM `+r.table("outbox")+`
WHERE pipe LIKE ? AND status = 'pending' AND next_attempt_at > NOW(6) AND claimer <> 0 GROUP BY pipe`, r.pipeLike())
	if err != nil {
		return nil, fmt.Errorf("count claimed outbox rows: %w", err)
	}
	for claimed.Next() {
		var s metrics.OutboxStat
		if err := claimed.Scan(&s.Pipe, &s.Rows); err != nil {
			claimed.Close()
			return nil, fmt.Errorf("count claimed outbox rows: %w", err)
		}
		s.Status = "delivering"
		for i := range out {
			if out[i].Pipe == s.Pipe && out[i].Status == "pending" {
				out[i].Rows -= s.Rows
			}
		}
		out = append(out, s)
	}
	if err := claimed.Err(); err != nil {
		claimed.Close()
		return nil, fmt.Errorf("count claimed outbox rows: %w", err)
	}
	claimed.Close()
	ages, err := r.DB.QueryContext(ctx, `SELECT pipe, TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6))
FROM `+r.table("outbox")+` WHERE pipe LIKE ? AND status = 'pending' GROUP BY pipe`, r.pipeLike())
	if err != nil {
		return nil, fmt.Errorf("read oldest pending: %w", err)
	}
	defer ages.Close()
	age := map[string]time.Duration{}
	for ages.Next() {
		var pipe string
		var us sql.NullInt64
		if err := ages.Scan(&pipe, &us); err != nil {
			return nil, fmt.Errorf("read oldest pending: %w", err)
		}
		age[pipe] = time.Duration(us.Int64) * time.Microsecond
	}
	if err := ages.Err(); err != nil {
		return nil, fmt.Errorf("read oldest pending: %w", err)
	}
	hasPending := map[string]bool{}
	for i := range out {
		if out[i].Status == "pending" {
			out[i].OldestPendingAge = age[out[i].Pipe]
			hasPending[out[i].Pipe] = true
		}
	}
	// A pipe whose only undelivered rows are being delivered still has an
	// oldest undelivered row; report it on a zero "pending" stat.
	for pipe, a := range age {
		if !hasPending[pipe] {
			out = append(out, metrics.OutboxStat{Pipe: pipe, Status: "pending", OldestPendingAge: a})
		}
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
	var rows []fleet.Row
	for _, row := range all {
		var info EngineInfo
		if len(row.Payload) > 0 && json.Unmarshal(row.Payload, &info) == nil && info.Instance != r.Instance {
			continue
		}
		// Undecodable payloads stay in: Merge reports them as unreadable
		// (their member missing) rather than this filter hiding them.
		rows = append(rows, row)
	}
	members, err := fleet.Members(ctx, r.DB, r.Schema, r.Instance, rows, r.StaleAfter)
	if err != nil {
		return Fleet{}, err
	}
	return fleet.Merge[EngineInfo](rows, members, r.StaleAfter), nil
}

// Dead returns up to limit dead rows of the instance, newest first.
func (r Reader) Dead(ctx context.Context, limit int) ([]DeadRow, error) {
	if err := state.CheckName(r.Schema); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 1000 {
		limit = 50
	}
	rows, err := r.DB.QueryContext(ctx, `SELECT id, pipe, db, tbl, op, attempts, last_error, last_error_at
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
		if err := rows.Scan(&d.ID, &d.Pipe, &db, &tbl, &d.Op, &d.Attempts, &msg, &at); err != nil {
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
