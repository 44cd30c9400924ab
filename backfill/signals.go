package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cdcout/cdcout/state"
)

// Signals: one row of backfill_signals asks the fleet's enqueue leader for
// a backfill, as Debezium's execute-snapshot signal does:
//
//	INSERT INTO cdcout.backfill_signals (instance, tbl, where_sql, sinks, read_only)
//	VALUES ('default', 'shop.orders', 'created_at >= ''2026-01-01''', 'orders-hook', 0);
//
// The leader picks pending rows up within a second or two, writes the
// backfill's id (status running) or why it refused (status failed, error),
// and, when the backfill ends, its outcome (done, failed, cancelled).

// Signal states.
const (
	SignalPending = "pending"
	SignalRunning = "running"
)

// Signal is one row of backfill_signals.
type Signal struct {
	ID         int64     `json:"id"`
	Instance   string    `json:"instance"`
	Table      string    `json:"table"`
	Where      string    `json:"where,omitempty"`
	Sinks      []string  `json:"sinks,omitempty"`
	ReadOnly   bool      `json:"read_only"`
	ChunkSize  int       `json:"chunk_size,omitempty"`
	Status     string    `json:"status"`
	BackfillID string    `json:"backfill_id,omitempty"`
	Error      string    `json:"error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

const signalColumns = "id, instance, tbl, COALESCE(where_sql, ''), COALESCE(sinks, ''), read_only, chunk_size, status, COALESCE(backfill_id, ''), COALESCE(error, ''), " +
	"DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f')"

func scanSignal(s scanner) (Signal, error) {
	var g Signal
	var sinks, created, updated string
	if err := s.Scan(&g.ID, &g.Instance, &g.Table, &g.Where, &sinks, &g.ReadOnly, &g.ChunkSize, &g.Status, &g.BackfillID, &g.Error, &created, &updated); err != nil {
		return Signal{}, err
	}
	g.Sinks = SplitSinks(sinks)
	g.CreatedAt, _ = time.Parse(timeLayout, created)
	g.UpdatedAt, _ = time.Parse(timeLayout, updated)
	return g, nil
}

// SplitSinks reads the sinks column: names separated by commas (blanks
// around them ignored); empty means every sink subscribed to the table.
func SplitSinks(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// InsertSignal records a signal (POST /v1/backfills writes one, as an
// operator's INSERT would) and returns its id.
func InsertSignal(ctx context.Context, db *sql.DB, schema string, g Signal) (int64, error) {
	res, err := db.ExecContext(ctx, "INSERT INTO "+state.Table(schema, "backfill_signals")+
		" (instance, tbl, where_sql, sinks, read_only, chunk_size) VALUES (?, ?, ?, ?, ?, ?)",
		g.Instance, g.Table, nullable(g.Where), nullable(strings.Join(g.Sinks, ",")), g.ReadOnly, g.ChunkSize)
	if err != nil {
		return 0, fmt.Errorf("record backfill signal: %w", err)
	}
	return res.LastInsertId()
}

// Signals lists instance's signals ("": every instance's), newest first,
// at most limit.
func Signals(ctx context.Context, db *sql.DB, schema, instance string, limit int) ([]Signal, error) {
	q := "SELECT " + signalColumns + " FROM " + state.Table(schema, "backfill_signals")
	if instance == "" {
		return querySignals(ctx, db, q+" ORDER BY id DESC LIMIT ?", limit)
	}
	return querySignals(ctx, db, q+" WHERE instance = ? ORDER BY id DESC LIMIT ?", instance, limit)
}

// PendingSignals are instance's signals not picked up yet, oldest first.
func PendingSignals(ctx context.Context, db *sql.DB, schema, instance string) ([]Signal, error) {
	return querySignals(ctx, db, "SELECT "+signalColumns+" FROM "+state.Table(schema, "backfill_signals")+
		" WHERE instance = ? AND status = ? ORDER BY id LIMIT 50", instance, SignalPending)
}

func querySignals(ctx context.Context, db *sql.DB, q string, args ...any) ([]Signal, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read backfill signals: %w", err)
	}
	defer rows.Close()
	var out []Signal
	for rows.Next() {
		g, err := scanSignal(rows)
		if err != nil {
			return nil, fmt.Errorf("read backfill signals: %w", err)
		}
		out = append(out, g)
	}
	return out, rows.Err()
}

// ErrSignalNotLinked: SignalStarted found the backfill no longer running
// (it ended after Prepare returned it), or the signal no longer pending.
// The signal is left as it was; a pending one is taken up again.
var ErrSignalNotLinked = errors.New("the backfill signal was not linked")

// SignalStarted records that signal id started (or continues) backfill,
// only while that backfill is running: the UPDATE reads the backfill's row
// with a lock, so it is ordered with the transaction that ends the
// backfill (end, cancel), which copies the outcome to the signals linked
// before it. Linking to a backfill that has ended would leave the signal
// reading running for good; that returns ErrSignalNotLinked instead.
func SignalStarted(ctx context.Context, db *sql.DB, schema string, id int64, backfill string) error {
	res, err := db.ExecContext(ctx, "UPDATE "+state.Table(schema, "backfill_signals")+" s JOIN "+state.Table(schema, "backfills")+
		" b ON b.id = ? AND b.status = ? SET s.status = ?, s.backfill_id = b.id, s.error = NULL, s.updated_at = NOW(6) WHERE s.id = ? AND s.status = ?",
		backfill, StatusRunning, SignalRunning, id, SignalPending)
	if err != nil {
		return fmt.Errorf("record backfill signal %d: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("record backfill signal %d: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("%w: signal %d, backfill %s", ErrSignalNotLinked, id, backfill)
	}
	return nil
}

// SignalRefused records why signal id starts nothing.
func SignalRefused(ctx context.Context, db *sql.DB, schema string, id int64, reason error) error {
	msg := strings.TrimPrefix(reason.Error(), ErrBadInput.Error()+": ")
	if _, err := db.ExecContext(ctx, "UPDATE "+state.Table(schema, "backfill_signals")+
		" SET status = ?, error = ?, updated_at = NOW(6) WHERE id = ? AND status = ?",
		StatusFailed, msg, id, SignalPending); err != nil {
		return fmt.Errorf("record backfill signal %d: %w", id, err)
	}
	return nil
}

// execer is what signalsFinished writes through: the pool or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func signalsFinished(ctx context.Context, db execer, schema, id, status, errText string) error {
	_, err := db.ExecContext(ctx, "UPDATE "+state.Table(schema, "backfill_signals")+
		" SET status = ?, error = ?, updated_at = NOW(6) WHERE backfill_id = ? AND status = ?",
		status, nullable(errText), id, SignalRunning)
	return err
}

// end sets running backfill id to status (done or failed, with errText) and
// copies that outcome to the signals that started it, in one transaction:
// no reader of the state tables sees a finished backfill whose signal still
// reads running. A backfill that is no longer running is left as it is, and
// so are its signals.
func end(ctx context.Context, db *sql.DB, schema, id, status, errText string) error {
	return endWith(ctx, db, schema, id, status, errText,
		"SET status = ?, error = ?, updated_at = NOW(6) WHERE id = ? AND status = ?",
		status, nullable(errText), id, StatusRunning)
}

// cancel sets backfill id cancelled unless it is done or cancelled already,
// and its running signals with it, in one transaction (as end does).
func cancel(ctx context.Context, db *sql.DB, schema, id string) error {
	return endWith(ctx, db, schema, id, StatusCancelled, "",
		"SET status = ?, updated_at = NOW(6) WHERE id = ? AND status NOT IN (?, ?)",
		StatusCancelled, id, StatusDone, StatusCancelled)
}

// endWith updates backfill id (set, the UPDATE's SET and WHERE, with args)
// and, when that changed its row, copies status and errText to its running
// signals, in one transaction.
func endWith(ctx context.Context, db *sql.DB, schema, id, status, errText, set string, args ...any) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, "UPDATE "+state.Table(schema, "backfills")+" "+set, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n > 0 {
		if err := signalsFinished(ctx, tx, schema, id, status, errText); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// FleetRunning lists the backfills instance's enqueue leader owes a run:
// owned by the fleet and running.
func FleetRunning(ctx context.Context, db *sql.DB, schema, instance string) ([]Info, error) {
	running, err := state.Collect(ctx, db, "SELECT "+infoColumns+" FROM "+state.Table(schema, "backfills")+
		" WHERE status = ? ORDER BY created_at, id", []any{StatusRunning}, scanInfoRow)
	if err != nil {
		return nil, fmt.Errorf("list running backfills: %w", err)
	}
	var out []Info
	for _, i := range running {
		if i.Owner == OwnerFleet && i.Instance == instance {
			out = append(out, i)
		}
	}
	return out, nil
}

// IsBadInput reports an error the operator fixes by changing the request.
func IsBadInput(err error) bool { return errors.Is(err, ErrBadInput) }
