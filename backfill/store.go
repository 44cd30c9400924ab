package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cdcout/cdcout/state"
)

// ErrNotFound: no backfill has the id.
var ErrNotFound = errors.New("no such backfill")

// ErrCancelled ends a Runner whose backfill was cancelled (cdcout backfill
// cancel).
var ErrCancelled = errors.New("backfill cancelled")

// Info is one row of the backfills table.
type Info struct {
	ID        string
	Table     string // "db.tbl"
	Instance  string
	Sinks     []string
	Where     string
	ChunkSize int
	// LastKey is the canonical JSON of the last key of the completed
	// prefix ("" before the first chunk).
	LastKey      string
	RowsDone     int64
	RowsEstimate int64
	Status       string
	Error        string
	// ReadOnly, Owner, Origin: see Spec.
	ReadOnly  bool
	Owner     string
	Origin    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// meta is what backfills.sinks holds: the backfill's selection and
// settings as JSON (the table predates them).
type meta struct {
	Instance  string   `json:"instance"`
	Sinks     []string `json:"sinks"`
	ChunkSize int      `json:"chunk_size"`
	// Resume is the raw key position (keyArgs.encode) after the completed
	// prefix; LastKey in last_key is its readable form.
	Resume string `json:"resume,omitempty"`
	// KeyOrder: change keys carry the key's order prefix (every backfill
	// started since; an older one keeps the plain digest when resumed, so
	// its re-read rows still collapse on their claims).
	KeyOrder bool `json:"key_order,omitempty"`
	// ReadOnly: chunks fenced by binlog positions (readonly.go).
	ReadOnly bool `json:"read_only,omitempty"`
	// Owner and Origin: see Spec.
	Owner  string `json:"owner,omitempty"`
	Origin string `json:"origin,omitempty"`
}

// List returns the backfills in the state database, newest first.
func List(ctx context.Context, db *sql.DB, schema string) ([]Info, error) {
	out, err := state.Collect(ctx, db, "SELECT "+infoColumns+" FROM "+
		state.Table(schema, "backfills")+" ORDER BY created_at DESC, id DESC", nil, scanInfoRow)
	if err != nil {
		return nil, fmt.Errorf("list backfills: %w", err)
	}
	return out, nil
}

// infoColumns are read with times as text so the scan works whatever the
// DSN's parseTime.
const infoColumns = "id, tbl, sinks, COALESCE(where_sql, ''), COALESCE(last_key, ''), rows_done, rows_estimate, status, COALESCE(error, ''), " +
	"DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f')"

const timeLayout = "2006-01-02 15:04:05.999999"

type scanner interface{ Scan(dest ...any) error }

func scanInfo(s scanner) (Info, meta, error) {
	var i Info
	var m meta
	var sinks, created, updated string
	if err := s.Scan(&i.ID, &i.Table, &sinks, &i.Where, &i.LastKey, &i.RowsDone, &i.RowsEstimate, &i.Status, &i.Error, &created, &updated); err != nil {
		return Info{}, meta{}, err
	}
	i.CreatedAt, _ = time.Parse(timeLayout, created)
	i.UpdatedAt, _ = time.Parse(timeLayout, updated)
	_ = json.Unmarshal([]byte(sinks), &m)
	i.Instance, i.Sinks, i.ChunkSize = m.Instance, m.Sinks, m.ChunkSize
	i.ReadOnly, i.Owner, i.Origin = m.ReadOnly, m.Owner, m.Origin
	return i, m, nil
}

// scanInfoRow is scanInfo for state.Collect.
func scanInfoRow(rows *sql.Rows) (Info, error) {
	i, _, err := scanInfo(rows)
	return i, err
}

// Get returns one backfill.
func Get(ctx context.Context, db *sql.DB, schema, id string) (Info, error) {
	i, _, err := get(ctx, db, schema, id)
	return i, err
}

func get(ctx context.Context, db *sql.DB, schema, id string) (Info, meta, error) {
	row := db.QueryRowContext(ctx, "SELECT "+infoColumns+" FROM "+
		state.Table(schema, "backfills")+" WHERE id = ?", id)
	i, m, err := scanInfo(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Info{}, meta{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Info{}, meta{}, fmt.Errorf("read backfill %s: %w", id, err)
	}
	return i, m, nil
}

// Cancel marks a backfill cancelled; its Runner stops at its next chunk
// and the rows already enqueued stay. A finished backfill is left as it is.
func Cancel(ctx context.Context, db *sql.DB, schema, id string) (Info, error) {
	i, err := Get(ctx, db, schema, id)
	if err != nil {
		return Info{}, err
	}
	if i.Status == StatusDone || i.Status == StatusCancelled {
		return i, nil
	}
	if err := cancel(ctx, db, schema, id); err != nil {
		return Info{}, fmt.Errorf("cancel backfill %s: %w", id, err)
	}
	for _, t := range []string{"backfill_chunks", "backfill_fences"} {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+state.Table(schema, t)+" WHERE backfill_id = ?", id); err != nil {
			return Info{}, fmt.Errorf("cancel backfill %s: drop its chunks: %w", id, err)
		}
	}
	i.Status = StatusCancelled
	return i, nil
}

// Fail marks a running backfill failed with reason.
func Fail(ctx context.Context, db *sql.DB, schema, id, reason string) error {
	if err := end(ctx, db, schema, id, StatusFailed, reason); err != nil {
		return fmt.Errorf("record backfill %s failed: %w", id, err)
	}
	return nil
}

// findResumable returns the unfinished backfill with the same selection,
// so that running the same command again continues it.
func findResumable(ctx context.Context, db *sql.DB, schema string, spec Spec) (Info, meta, bool, error) {
	rows, err := db.QueryContext(ctx, "SELECT "+infoColumns+" FROM "+
		state.Table(schema, "backfills")+" WHERE tbl = ? AND status IN (?, ?) ORDER BY created_at DESC", spec.Table, StatusRunning, StatusFailed)
	if err != nil {
		return Info{}, meta{}, false, fmt.Errorf("look up unfinished backfills: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		i, m, err := scanInfo(rows)
		if err != nil {
			return Info{}, meta{}, false, fmt.Errorf("look up unfinished backfills: %w", err)
		}
		if i.Instance == spec.Instance && i.Where == spec.Where && slices.Equal(sorted(i.Sinks), sorted(spec.Sinks)) &&
			i.ReadOnly == spec.ReadOnly && i.Owner == spec.Owner {
			return i, m, true, nil
		}
	}
	return Info{}, meta{}, false, rows.Err()
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
