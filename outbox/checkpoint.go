package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/binlog"
)

// Checkpoint is a resume position to store with an enqueue.
type Checkpoint struct {
	// Source is the checkpoint's scope, "enqueue/<instance>": one per
	// source instance.
	Source string
	// Pos is the position just after the last transaction whose changes
	// the same enqueue (or an earlier one) wrote.
	Pos binlog.Position
}

// LoadCheckpoint returns the stored position of source, or nil (and no
// error) when there is none yet.
func (s *Store) LoadCheckpoint(ctx context.Context, source string) (*binlog.Position, error) {
	pos, err := s.loadCheckpoint(ctx, s.db, source)
	if err != nil {
		return nil, err
	}
	return pos, nil
}

type rowQueryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) loadCheckpoint(ctx context.Context, q rowQueryer, source string) (*binlog.Position, error) {
	var raw string
	err := q.QueryRowContext(ctx, "SELECT position FROM "+s.checkpoints+" WHERE source = ?", source).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", source, err)
	}
	var pos binlog.Position
	if err := json.Unmarshal([]byte(raw), &pos); err != nil {
		return nil, fmt.Errorf("read checkpoint %s: decode position: %w", source, err)
	}
	return &pos, nil
}

// LoadCheckpointAndClaims returns the checkpoint of source and the digest
// change keys claimed during the last since and no later than the
// checkpoint's write, read in one consistent snapshot.
//
// A digest-mode replica seeds its OccurrenceCounter from these keys before
// it keys the first change after the checkpoint. They must come from the same
// snapshot: a claim committed between the two reads would belong to a
// change after the checkpoint, count it twice, and re-key the change when
// the replica reads it again.
//
// Claims created after the checkpoint's write are left out for the same
// reason: rows of a huge transaction are written before its commit (without
// a checkpoint), and a replica that stops inside it reads the transaction
// again from the checkpoint. Seeding from those claims would give the
// replayed rows the next occurrence (a new change key) instead of the one
// they were written under, and every such row would be enqueued twice
// (found by e2e TestCrashRecovery/digest). Claims and checkpoint both carry
// the database clock, and a checkpoint is written after the claims of its
// own transaction, so the comparison is exact. Without a checkpoint nothing
// was enqueued that a replay could meet: nil position, no keys.
func (s *Store) LoadCheckpointAndClaims(ctx context.Context, source string, since time.Duration) (*binlog.Position, []string, error) {
	// REPEATABLE READ fixes the snapshot at the transaction's first read,
	// so both SELECTs below see the same committed state, as START
	// TRANSACTION WITH CONSISTENT SNAPSHOT would.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, nil, fmt.Errorf("read checkpoint and claims: begin: %w", err)
	}
	defer tx.Rollback()

	var raw, updated string
	err = tx.QueryRowContext(ctx, "SELECT position, DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f') FROM "+
		s.checkpoints+" WHERE source = ?", source).Scan(&raw, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read checkpoint %s: %w", source, err)
	}
	var pos binlog.Position
	if err := json.Unmarshal([]byte(raw), &pos); err != nil {
		return nil, nil, fmt.Errorf("read checkpoint %s: decode position: %w", source, err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT change_key FROM "+s.claims+
		" WHERE created_at >= NOW(6) - INTERVAL ? MICROSECOND AND created_at <= ? AND change_key LIKE 'd:%' ORDER BY created_at",
		since.Microseconds(), updated)
	if err != nil {
		return nil, nil, fmt.Errorf("read recent claims: %w", err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, nil, fmt.Errorf("read recent claims: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read recent claims: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, fmt.Errorf("read checkpoint and claims: commit: %w", err)
	}
	return &pos, keys, nil
}

// ResetCheckpoint forgets the position of source, so the next start begins
// where --from says. It is the --reset-position escape hatch and is not
// fenced: the operator asked for it.
func (s *Store) ResetCheckpoint(ctx context.Context, source string) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM "+s.checkpoints+" WHERE source = ?", source); err != nil {
		return fmt.Errorf("reset checkpoint %s: %w", source, err)
	}
	return nil
}

// advanceCheckpoint writes cp inside tx, conditional on fence.
//
// The lease row is read with a shared lock and checked against the database
// clock first: a takeover (an UPDATE of that row) then waits until this
// transaction ends, so there is no gap between the check and the commit in
// which another replica could start from an older checkpoint while this one
// still writes. 0 matching lease rows ⇒ ErrFenced.
func (s *Store) advanceCheckpoint(ctx context.Context, tx *sql.Tx, fence Fence, cp *Checkpoint) error {
	var epoch uint64
	err := tx.QueryRowContext(ctx, "SELECT epoch FROM "+s.leases+
		" WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > NOW(6) LOCK IN SHARE MODE",
		fence.Lease, fence.Holder, fence.Epoch).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrFenced
	}
	if err != nil {
		return fmt.Errorf("check enqueue lease: %w", err)
	}
	pos, err := json.Marshal(cp.Pos)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.checkpoints+
		" (source, position, epoch, holder, updated_at) VALUES (?, ?, ?, ?, NOW(6))"+
		// updated_at is when the position last moved (assignments run in
		// order: it is compared before position changes). Digest mode
		// seeds its counter from the claims written up to then; while the
		// position is held back (a prepared XA transaction, binlog/xa.go)
		// the claims of the transactions after it must stay out, since a
		// restart replays them.
		" ON DUPLICATE KEY UPDATE updated_at = IF(position = VALUES(position), updated_at, VALUES(updated_at)),"+
		" position = VALUES(position), epoch = VALUES(epoch), holder = VALUES(holder)",
		cp.Source, string(pos), fence.Epoch, fence.Holder); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", cp.Source, err)
	}
	return nil
}
