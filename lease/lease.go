// Package lease implements leadership leases over the state database's
// leases table: one row per lease name with (holder, epoch, expires_at).
//
// Every statement is a single conditional write evaluated by the database,
// and every time comparison uses the database clock NOW(6), so replicas with
// skewed clocks still agree on who holds a lease. The epoch grows whenever a
// lease starts a new tenure (another holder takes it, or it is taken again
// after it lapsed); writes that need leadership carry the epoch in their
// WHERE clause, so a paused old holder's writes match zero rows (fencing).
//
// A holder also keeps a local monotonic deadline that ends a safety margin
// before the lease can have expired on the database clock: a holder that
// cannot renew (network partition, GC pause, overloaded database) stops
// acting on its own, before anybody else can have taken over.
package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/state"
)

// ErrNotHeld means the caller does not (or no longer) hold the lease: it
// expired, or another holder took it over.
var ErrNotHeld = errors.New("lease not held")

// Lease is one lease as its holder (or a reader) knows it.
type Lease struct {
	Name   string
	Holder string
	// Epoch fences leadership writes: they are conditional on it.
	Epoch uint64
	// ExpiresAt is the database clock's expiry, for display; decisions
	// compare against NOW(6) in the database, never against this value.
	ExpiresAt time.Time
	// LocalDeadline is the local (monotonic) time after which the holder
	// must stop acting: the local time before the acquiring statement was
	// sent, plus TTL, minus a safety margin. Zero for leases read with Get
	// or List.
	LocalDeadline time.Time
	// TTL is the duration the lease was acquired or renewed for.
	TTL time.Duration
	// Live reports, for Get and List, whether expires_at was after the
	// database's NOW(6) when read.
	Live bool
}

// Valid reports whether a lease we acquired may still be acted on at now
// (a local time.Now(), which carries the monotonic clock).
func (l Lease) Valid(now time.Time) bool {
	return l.Holder != "" && !l.LocalDeadline.IsZero() && now.Before(l.LocalDeadline)
}

// Manager acquires, renews and releases leases in one state database.
type Manager struct {
	db    *sql.DB
	table string
	// margin is subtracted from the TTL for LocalDeadline; see safetyMargin.
	margin func(ttl time.Duration) time.Duration
}

// NewManager returns a Manager over schema's leases table.
func NewManager(db *sql.DB, schema string) *Manager {
	return &Manager{db: db, table: state.Table(schema, "leases"), margin: safetyMargin}
}

// safetyMargin is how much earlier than the database expiry a holder stops
// acting: a tenth of the TTL, at least 100ms and at most 5s. It absorbs
// clock-rate differences and the time between the database evaluating
// NOW(6) and our statement returning.
func safetyMargin(ttl time.Duration) time.Duration {
	m := ttl / 10
	if m < 100*time.Millisecond {
		m = 100 * time.Millisecond
	}
	if m > 5*time.Second {
		m = 5 * time.Second
	}
	if m > ttl/2 {
		m = ttl / 2
	}
	return m
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// Acquire takes the lease name for holder for ttl if it is free, expired or
// already held by holder (then it is a renewal). ok reports whether holder
// holds it afterwards; when not, the returned Lease describes the current
// holder.
//
// The epoch stays when a live lease is re-acquired by its holder and grows
// on every new tenure: a takeover by another holder, or a re-acquisition
// after the lease lapsed or was released (the old tenure's writes must not
// pass as the new one's).
func (m *Manager) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (Lease, bool, error) {
	if holder == "" {
		return Lease{}, false, errors.New("acquire lease: holder is empty")
	}
	if ttl <= 0 {
		return Lease{}, false, fmt.Errorf("acquire lease %s: ttl %v must be positive", name, ttl)
	}
	start := time.Now()
	// MySQL evaluates ON DUPLICATE KEY UPDATE assignments left to right,
	// each seeing the previous ones' results: the conditions read holder
	// and expires_at, so those two are assigned last (after holder is set
	// to ours, "holder = VALUES(holder)" stays true exactly when we took it).
	q := `INSERT INTO ` + m.table + ` (name, holder, epoch, expires_at, acquired_at, renewed_at)
VALUES (?, ?, 1, NOW(6) + INTERVAL ? MICROSECOND, NOW(6), NOW(6))
ON DUPLICATE KEY UPDATE
  epoch = IF(holder = VALUES(holder) AND expires_at > NOW(6), epoch,
             IF(expires_at <= NOW(6), epoch + 1, epoch)),
  acquired_at = IF(holder = VALUES(holder) AND expires_at > NOW(6), acquired_at,
             IF(expires_at <= NOW(6), NOW(6), acquired_at)),
  renewed_at = IF(holder = VALUES(holder) OR expires_at <= NOW(6), NOW(6), renewed_at),
  holder = IF(holder = VALUES(holder) OR expires_at <= NOW(6), VALUES(holder), holder),
  expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at)`
	if _, err := m.db.ExecContext(ctx, q, name, holder, micros(ttl)); err != nil {
		return Lease{}, false, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	cur, found, err := m.Get(ctx, name)
	if err != nil {
		return Lease{}, false, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	if !found || cur.Holder != holder || !cur.Live {
		return cur, false, nil
	}
	cur.TTL = ttl
	cur.LocalDeadline = start.Add(ttl - m.margin(ttl))
	return cur, true, nil
}

// Renew extends a held lease by its TTL. It fails with ErrNotHeld when the
// lease expired or changed holder or epoch since l was obtained; the caller
// must then stop acting as leader.
func (m *Manager) Renew(ctx context.Context, l Lease) (Lease, error) {
	if l.TTL <= 0 {
		return l, fmt.Errorf("renew lease %s: lease has no ttl (not acquired by this manager)", l.Name)
	}
	start := time.Now()
	res, err := m.db.ExecContext(ctx, `UPDATE `+m.table+`
SET expires_at = NOW(6) + INTERVAL ? MICROSECOND, renewed_at = NOW(6)
WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > NOW(6)`, micros(l.TTL), l.Name, l.Holder, l.Epoch)
	if err != nil {
		return l, fmt.Errorf("renew lease %s: %w", l.Name, err)
	}
	cur, found, err := m.Get(ctx, l.Name)
	if err != nil {
		return l, fmt.Errorf("renew lease %s: %w", l.Name, err)
	}
	n, _ := res.RowsAffected()
	// Zero rows affected can also mean "nothing changed" (a renewal in the
	// same microsecond), so the read-back decides.
	if !found || cur.Holder != l.Holder || cur.Epoch != l.Epoch || !cur.Live {
		return l, ErrNotHeld
	}
	if n == 0 {
		// Still ours, but this statement did not extend it: keep the old
		// local deadline rather than claim time we were not given.
		cur.TTL, cur.LocalDeadline = l.TTL, l.LocalDeadline
		return cur, nil
	}
	cur.TTL = l.TTL
	cur.LocalDeadline = start.Add(l.TTL - m.margin(l.TTL))
	return cur, nil
}

// Release gives a held lease up at once (expires_at = NOW(6)) so another
// replica can take it without waiting for the TTL. The epoch is kept; the
// next holder's Acquire raises it. Releasing a lease no longer held returns
// ErrNotHeld, which callers shutting down may ignore.
func (m *Manager) Release(ctx context.Context, l Lease) error {
	res, err := m.db.ExecContext(ctx, `UPDATE `+m.table+`
SET expires_at = NOW(6)
WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > NOW(6)`, l.Name, l.Holder, l.Epoch)
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.Name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotHeld
	}
	return nil
}

const selectCols = `name, holder, epoch, expires_at, expires_at > NOW(6)`

// Get reads one lease; found is false when no row exists.
func (m *Manager) Get(ctx context.Context, name string) (Lease, bool, error) {
	row := m.db.QueryRowContext(ctx, `SELECT `+selectCols+` FROM `+m.table+` WHERE name = ?`, name)
	l, err := scanLease(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Lease{Name: name}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("read lease %s: %w", name, err)
	}
	return l, true, nil
}

// List reads every lease whose name starts with prefix, ordered by name.
func (m *Manager) List(ctx context.Context, prefix string) ([]Lease, error) {
	rows, err := m.db.QueryContext(ctx, `SELECT `+selectCols+` FROM `+m.table+` WHERE name LIKE ? ORDER BY name`, state.LikePrefix(prefix))
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, fmt.Errorf("list leases %q: %w", prefix, err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	return out, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanLease(s scanner) (Lease, error) {
	var (
		l    Lease
		exp  state.Time // parseTime=true or not
		live bool
	)
	if err := s.Scan(&l.Name, &l.Holder, &l.Epoch, &exp, &live); err != nil {
		return Lease{}, err
	}
	l.ExpiresAt, l.Live = exp.T, live
	return l, nil
}
