// Package fleet records what each replica says about itself in the state
// database's replicas table, and merges those rows into one honest fleet
// view: who answered, who should have and did not (missing), whose row is
// too old to trust as current (stale, with its age), and which versions run
// when they are not all the same.
//
// Each replica upserts its own row under (replica_id, kind) every few
// seconds (Heartbeat); a restarted replica overwrites its previous
// generation's row, and one that left for good is removed with Forget
// (`cdcout fleet forget ID`), because nothing else would ever age it out.
package fleet

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/state"
)

// Defaults.
const (
	// DefaultStaleAfter is how old a row may be before a reader stops
	// trusting it as current. It is a setting, not a law: a fleet that
	// writes every 30s and one that writes every 5 minutes disagree about
	// what "stale" means. 120s is four missed writes at DefaultWriteEvery.
	DefaultStaleAfter = 120 * time.Second
	// DefaultWriteEvery is the Heartbeat's write interval.
	DefaultWriteEvery = 30 * time.Second
	// membershipWindow multiplies staleAfter to bound how long a replica
	// that holds no lease still counts as a member on the strength of its
	// row alone (see Members).
	membershipWindow = 3
)

// KindEngine is the kind of the row a `cdcout run` replica writes.
const KindEngine = "engine"

// Observation is what one replica writes about itself.
type Observation struct {
	ReplicaID string
	Kind      string
	// StartedAt identifies the process generation: a row whose StartedAt
	// is older than the member's is a previous generation's.
	StartedAt time.Time
	Version   string
	// Payload is stored as JSON.
	Payload any
	// ReachableAt is where a peer can reach the replica (its inspect
	// address), or "" — never a guess.
	ReachableAt string
}

// Row is one stored observation as read back.
type Row struct {
	ReplicaID   string          `json:"replicaId"`
	Kind        string          `json:"kind"`
	StartedAt   time.Time       `json:"startedAt"`
	Version     string          `json:"version,omitempty"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	ReachableAt string          `json:"reachableAt,omitempty"`
	WrittenAt   time.Time       `json:"writtenAt"`
	// Age is how old the row is on the state database's clock, the same
	// clock that stamped written_at, so replicas' clock skew does not enter
	// it. Good for "minutes old"; never for ordering two rows.
	Age time.Duration `json:"-"`
}

// Write upserts o's row; written_at is the database's NOW(6).
func Write(ctx context.Context, db *sql.DB, schema string, o Observation) error {
	if err := state.CheckName(schema); err != nil {
		return err
	}
	if o.ReplicaID == "" || o.Kind == "" {
		return fmt.Errorf("write fleet observation: replica id and kind are required")
	}
	payload, err := json.Marshal(o.Payload)
	if err != nil {
		return fmt.Errorf("write fleet observation: encode payload: %w", err)
	}
	var reach sql.NullString
	if o.ReachableAt != "" {
		reach = sql.NullString{String: o.ReachableAt, Valid: true}
	}
	started := o.StartedAt
	if started.IsZero() {
		started = time.Now()
	}
	_, err = db.ExecContext(ctx, `INSERT INTO `+state.Table(schema, "replicas")+`
  (replica_id, kind, started_at, version, payload, reachable_at, written_at)
VALUES (?, ?, ?, ?, ?, ?, NOW(6))
ON DUPLICATE KEY UPDATE started_at = VALUES(started_at), version = VALUES(version),
  payload = VALUES(payload), reachable_at = VALUES(reachable_at), written_at = NOW(6)`,
		o.ReplicaID, o.Kind, started.UTC().Format("2006-01-02 15:04:05.999999"), truncate(o.Version, 64), string(payload), reach)
	if err != nil {
		return fmt.Errorf("write fleet observation %s/%s: %w", o.ReplicaID, o.Kind, err)
	}
	return nil
}

// Read returns the rows of one kind (all kinds when kind is ""), ordered
// by replica id, each with its age on the database clock.
func Read(ctx context.Context, db *sql.DB, schema, kind string) ([]Row, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	q := `SELECT replica_id, kind, started_at, version, payload, reachable_at, written_at,
  TIMESTAMPDIFF(MICROSECOND, written_at, NOW(6))
FROM ` + state.Table(schema, "replicas")
	var args []any
	if kind != "" {
		q += ` WHERE kind = ?`
		args = append(args, kind)
	}
	q += ` ORDER BY replica_id, kind`
	out, err := state.Collect(ctx, db, q, args, func(rows *sql.Rows) (Row, error) {
		var (
			r              Row
			payload, reach sql.NullString
			started, wrote sqlTime
			ageUS          int64
		)
		if err := rows.Scan(&r.ReplicaID, &r.Kind, &started, &r.Version, &payload, &reach, &wrote, &ageUS); err != nil {
			return r, err
		}
		r.StartedAt, r.WrittenAt = started.T, wrote.T
		if payload.Valid {
			r.Payload = json.RawMessage(payload.String)
		}
		r.ReachableAt = reach.String
		r.Age = max(time.Duration(ageUS)*time.Microsecond, 0)
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read fleet observations: %w", err)
	}
	return out, nil
}

// Forget removes every row of a replica that is gone for good and reports
// how many were removed. Not a retention sweep: a restart overwrites its
// own row; this is for a scale-down, whose row would otherwise be counted
// (as stale) forever.
func Forget(ctx context.Context, db *sql.DB, schema, replicaID string) (int64, error) {
	if err := state.CheckName(schema); err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, `DELETE FROM `+state.Table(schema, "replicas")+` WHERE replica_id = ?`, replicaID)
	if err != nil {
		return 0, fmt.Errorf("forget replica %s: %w", replicaID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("forget replica %s: %w", replicaID, err)
	}
	return n, nil
}

// Members returns the live membership of a fleet, as the union of
//
//   - every replica holding a live lease whose name ends in "/<instance>"
//     or starts with "<kind>/<instance>:" (enqueue/<instance>,
//     drain/<instance>:…); the replica id is the holder up to its last "/"
//     (holders are "<replica-id>/<boot nonce>"), and
//   - every replica whose row (of this kind, in rows) was written within
//     staleAfter × membershipWindow.
//
// Leases are the authority on who is alive and working: a replica holding
// one but writing no row (an older binary, a failing write) is exactly the
// one that must show up as missing. Rows keep an idle standby, which holds
// no lease, in the membership; the window lets a crashed standby's row
// first turn stale (reported with its age) and then, after three stale
// periods, stop being expected — it is still listed until forgotten.
// StartedAt is unknown for lease members and left zero.
func Members(ctx context.Context, db *sql.DB, schema, instance string, rows []Row, staleAfter time.Duration) ([]Member, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	if staleAfter <= 0 {
		staleAfter = DefaultStaleAfter
	}
	seen := map[string]bool{}
	var out []Member
	esc := state.EscapeLike(instance)
	lr, err := db.QueryContext(ctx, `SELECT holder FROM `+state.Table(schema, "leases")+`
WHERE expires_at > NOW(6) AND holder <> '' AND (name LIKE ? OR name LIKE ?)`, "%/"+esc, "%/"+esc+":%")
	if err != nil {
		return nil, fmt.Errorf("read fleet membership: %w", err)
	}
	defer lr.Close()
	for lr.Next() {
		var holder string
		if err := lr.Scan(&holder); err != nil {
			return nil, fmt.Errorf("read fleet membership: %w", err)
		}
		id := holder
		if i := strings.LastIndex(holder, "/"); i > 0 {
			id = holder[:i]
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, Member{ID: id})
		}
	}
	if err := lr.Err(); err != nil {
		return nil, fmt.Errorf("read fleet membership: %w", err)
	}
	for _, r := range rows {
		if !seen[r.ReplicaID] && r.Age <= staleAfter*membershipWindow {
			seen[r.ReplicaID] = true
			out = append(out, Member{ID: r.ReplicaID, StartedAt: r.StartedAt})
		}
	}
	return out, nil
}

// Heartbeat writes a replica's observation every Every until its context
// ends. A failed write is logged and retried at the next tick: fleet rows
// are for people, and a state database hiccup must not stop a replica.
type Heartbeat struct {
	DB      *sql.DB
	Schema  string
	Every   time.Duration // default DefaultWriteEvery
	Observe func() Observation
	Logger  *zap.Logger
	// Changed, when set, asks for a write now (a role change must not wait
	// a whole period to show in the fleet view).
	Changed <-chan struct{}
	// Final, when set, is written once when Run's context ends: a replica
	// that stops says so at once, instead of looking alive (and, say, the
	// leader) until its row turns stale.
	Final func() Observation
}

// Run writes at once, then every Every and on every Changed signal, and
// returns nil when ctx ends.
func (h *Heartbeat) Run(ctx context.Context) error {
	every := h.Every
	if every <= 0 {
		every = DefaultWriteEvery
	}
	log := h.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("fleet")
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := Write(wctx, h.DB, h.Schema, h.Observe())
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("write fleet observation", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			if h.Final != nil {
				fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if err := Write(fctx, h.DB, h.Schema, h.Final()); err != nil {
					log.Warn("write final fleet observation", zap.Error(err))
				}
				cancel()
			}
			return nil
		case <-t.C:
		case <-h.Changed:
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sqlTime is state.Time: scans DATETIME columns with or without parseTime.
type sqlTime = state.Time
