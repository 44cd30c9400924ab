// Package outbox is cdcout's durable queue between the binlog and the
// sinks: the enqueue side writes claims, outbox rows and the checkpoint in
// one transaction (Store.Enqueue); the drain side claims due rows and
// delivers them to sinks with retries, dead letters and retention.
package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/state"
)

// ErrFenced means an enqueue was conditional on an enqueue lease that this
// replica no longer holds (it expired, or another replica took it over with
// a higher epoch). Nothing of that enqueue was committed. It wraps
// lease.ErrNotHeld, so either sentinel matches with errors.Is.
var ErrFenced = fmt.Errorf("enqueue fenced: %w", lease.ErrNotHeld)

// Store reads and writes the outbox, claims and checkpoints tables of one
// state database (created by state.Migrate).
type Store struct {
	db     *sql.DB
	schema string
	logger *zap.Logger

	outbox, segments, claims, checkpoints, leases string

	// segmentFormat is the form Enqueue writes segments in
	// (SegmentFormat1 unless WithSegmentFormat or SetSegmentFormat says
	// otherwise); every Store reads both. Shared by the copies the With
	// methods make, so SetSegmentFormat reaches them all.
	segmentFormat *atomic.Int32
	// readCommitted, when set, is where enqueue transactions begin
	// (WithReadCommitted).
	readCommitted *sql.DB
	// recent, when set, keeps the payloads of committed segments for this
	// process's drainers (WithRecent).
	recent *Recent
}

// NewStore returns a Store over the state database schema. The schema name
// must pass state.CheckName; callers validate configuration before they get
// here, so a bad name panics rather than producing malformed SQL.
func NewStore(db *sql.DB, schema string, logger *zap.Logger) *Store {
	if err := state.CheckName(schema); err != nil {
		panic(fmt.Sprintf("outbox.NewStore: %v", err))
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Store{
		db:          db,
		schema:      schema,
		logger:      logger.Named("outbox"),
		outbox:      state.Table(schema, "outbox"),
		segments:    state.Table(schema, "segments"),
		claims:      state.Table(schema, "claims"),
		checkpoints: state.Table(schema, "checkpoints"),
		leases:      state.Table(schema, "leases"),

		segmentFormat: newSegmentFormat(SegmentFormat1),
	}
}

func newSegmentFormat(f int) *atomic.Int32 {
	var v atomic.Int32
	v.Store(int32(f))
	return &v
}

// WithReadCommitted returns a copy of s whose enqueue transactions begin
// on db, a pool whose sessions run transactions at READ COMMITTED
// (state.Pool.ReadCommitted): one round trip fewer per transaction. Only
// a pool of that guarantee will do: the enqueue's locking read-back and
// its freedom from gap-lock deadlocks between enqueuers rely on it.
func (s *Store) WithReadCommitted(db *sql.DB) *Store {
	c := *s
	c.readCommitted = db
	return &c
}

// WithRecent returns a copy of s that keeps the payloads of the segments
// it commits in r, for the drainers given the same Recent
// (DrainerConfig.Recent).
func (s *Store) WithRecent(r *Recent) *Store {
	c := *s
	c.recent = r
	return &c
}

// WithSegmentFormat returns a copy of s that writes segments in format f
// (SegmentFormat1 or SegmentFormat2; anything else is SegmentFormat1).
// Format 2 is smaller, but a replica of a release before it cannot read
// it and halts the pipe at the first such segment, so it is for a fleet
// whose every replica reads it (config segment_format).
func (s *Store) WithSegmentFormat(f int) *Store {
	c := *s
	c.segmentFormat = newSegmentFormat(SegmentFormat1)
	c.SetSegmentFormat(f)
	return &c
}

// SetSegmentFormat makes the segments encoded from now on, by s and by
// the copies it shares its format with, format f (SegmentFormat1 or
// SegmentFormat2; anything else is SegmentFormat1). Segments already
// encoded keep theirs: each says its own format.
func (s *Store) SetSegmentFormat(f int) {
	if f != SegmentFormat2 {
		f = SegmentFormat1
	}
	s.segmentFormat.Store(int32(f))
}

// SegmentFormat is the format s encodes segments in now.
func (s *Store) SegmentFormat() int { return int(s.segmentFormat.Load()) }

// RaiseIDFloor makes this process's later outbox ids sort after the newest
// id already in the outbox. A replica calls it when it takes over the
// enqueue lease: the previous leader's clock may be ahead of ours, and an id
// smaller than an earlier change's would break per-key order.
func (s *Store) RaiseIDFloor(ctx context.Context) error {
	// Segments of one enqueue transaction interleave (one per pipe), so the
	// newest record id is the largest last_id among the newest segments;
	// one transaction writes far fewer than 1,000 of them.
	var maxID sql.NullString
	if err := s.db.QueryRowContext(ctx, "SELECT GREATEST(COALESCE((SELECT MAX(id) FROM "+s.outbox+"), ''),"+
		" COALESCE((SELECT MAX(last_id) FROM (SELECT last_id FROM "+s.segments+" ORDER BY id DESC LIMIT 1000) n), ''))").Scan(&maxID); err != nil {
		return fmt.Errorf("read newest outbox id: %w", err)
	}
	if maxID.String == "" {
		return nil
	}
	if !maxID.Valid {
		return nil
	}
	return raiseIDFloor(maxID.String)
}

// Analyze refreshes the optimizer's statistics of the outbox and segments
// tables, which a bulk enqueue leaves stale (benchmarks compare both).
func (s *Store) Analyze(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, "ANALYZE TABLE "+s.segments+", "+s.outbox); err != nil {
		return fmt.Errorf("analyze outbox tables: %w", err)
	}
	return nil
}
