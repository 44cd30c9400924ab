package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/state"
)

// Prepare checks the spec against the source (table, key, --where) and
// creates or finds the backfill row. Errors wrapping ErrBadInput are the
// operator's to fix; nothing has been enqueued then.
func (r *Runner) Prepare(ctx context.Context, spec Spec) (Info, error) {
	if r.Logger == nil {
		r.Logger = zap.NewNop()
	}
	if spec.ChunkSize <= 0 {
		spec.ChunkSize = DefaultChunkSize
	}
	if spec.ChunkSize > MaxChunkSize {
		return Info{}, badInput("--chunk-size %d: at most %d", spec.ChunkSize, MaxChunkSize)
	}
	r.wm = quoteIdent(WatermarkDB(r.StateSchema)) + "." + quoteIdent(WatermarkTable)
	r.store = newRunStore(r.State, r.StateSchema)
	if spec.ResumeID != "" {
		info, mm, err := get(ctx, r.State, r.StateSchema, spec.ResumeID)
		if errors.Is(err, ErrNotFound) {
			return Info{}, badInput("--resume %s: no such backfill (see cdcout backfill status)", spec.ResumeID)
		}
		if err != nil {
			return Info{}, err
		}
		if info.Status == StatusDone || info.Status == StatusCancelled {
			return Info{}, badInput("--resume %s: the backfill is %s", spec.ResumeID, info.Status)
		}
		spec = Spec{Table: info.Table, Sinks: info.Sinks, Where: info.Where, ChunkSize: max(mm.ChunkSize, 1), Instance: mm.Instance, ResumeID: info.ID,
			ReadOnly: mm.ReadOnly, Owner: mm.Owner, Origin: mm.Origin}
		r.id = info.ID
		r.store.id = r.id
	}
	t, err := check(ctx, r.Source, spec)
	if err != nil {
		return Info{}, err
	}
	r.table = t
	r.spec = spec
	r.readOnly = spec.ReadOnly
	if r.readOnly {
		if r.flavor, err = readOnlyFlavor(ctx, r.Source); err != nil {
			return Info{}, err
		}
	} else if err := r.ensureWatermarkTable(ctx); err != nil {
		return Info{}, err
	}
	if r.id != "" {
		if err := r.store.reopen(ctx, t.estimate); errors.Is(err, errEnded) {
			return Info{}, badInput("--resume %s: %v", r.id, err)
		} else if err != nil {
			return Info{}, err
		}
		return Get(ctx, r.State, r.StateSchema, r.id)
	}
	info, _, found, err := findResumable(ctx, r.State, r.StateSchema, spec)
	if err != nil {
		return Info{}, err
	}
	if found {
		r.id = info.ID
		r.store.id = r.id
		switch err := r.store.reopen(ctx, t.estimate); {
		case errors.Is(err, errEnded):
			// It finished (or was cancelled) between the lookup and now:
			// this request gets a backfill of its own.
			r.Logger.Info("the unfinished backfill with the same arguments ended meanwhile; starting a new one", zap.String("backfill", r.id))
			r.id = ""
		case err != nil:
			return Info{}, err
		default:
			r.Logger.Info("continuing the unfinished backfill with the same arguments", zap.String("backfill", r.id), zap.Int64("rows_done", info.RowsDone))
		}
	}
	if r.id == "" {
		r.id = newID()
		r.store.id = r.id
		m := meta{Instance: spec.Instance, Sinks: spec.Sinks, ChunkSize: spec.ChunkSize, KeyOrder: true, ReadOnly: spec.ReadOnly, Owner: spec.Owner, Origin: spec.Origin}
		if err := r.store.create(ctx, spec, m, t.estimate); err != nil {
			return Info{}, err
		}
	}
	return Get(ctx, r.State, r.StateSchema, r.id)
}

// Check checks spec's table and WHERE against the source without
// recording anything; errors wrapping ErrBadInput are the requester's.
func Check(ctx context.Context, source *sql.DB, spec Spec) error {
	_, err := check(ctx, source, spec)
	return err
}

func check(ctx context.Context, source *sql.DB, spec Spec) (*tableInfo, error) {
	db, name, ok := strings.Cut(spec.Table, ".")
	if !ok || db == "" || name == "" {
		return nil, badInput("--table %q: want db.table", spec.Table)
	}
	t, err := loadTable(ctx, source, db, name)
	if err != nil {
		return nil, err
	}
	if spec.Where != "" {
		if err := CheckWhere(spec.Where); err != nil {
			return nil, badInput("--where %q: %v", spec.Where, err)
		}
		// LIMIT 0 resolves every name and type without reading a row.
		if _, err := source.ExecContext(ctx, "SELECT 1 FROM "+t.qualified()+" WHERE ("+spec.Where+") LIMIT 0"); err != nil {
			var me *mysql.MySQLError
			if errors.As(err, &me) {
				return nil, badInput("--where %q: %s", spec.Where, me.Message)
			}
			return nil, fmt.Errorf("check --where: %w", err)
		}
	}
	return t, nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ErrWatermarkDenied: the source refuses the watermark database or table
// (no grants, read_only): a read-only backfill needs neither.
var ErrWatermarkDenied = errors.New("the source refuses watermark writes")

// denied wraps err with ErrWatermarkDenied when the server refused for
// lack of grants or because it is read-only.
func denied(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1044, 1045, 1142, 1143, 1227, 1290, 1836: // access denied (db, table, column, privilege), read_only, super_read_only
			return fmt.Errorf("%w: %w", ErrWatermarkDenied, err)
		}
	}
	return err
}

func (r *Runner) ensureWatermarkTable(ctx context.Context) error {
	if _, err := r.Source.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+quoteIdent(WatermarkDB(r.StateSchema))); err != nil {
		return fmt.Errorf("create watermark database %s on the source (grant CREATE on it, or create it, or backfill read-only): %w", WatermarkDB(r.StateSchema), denied(err))
	}
	if err := state.CreateMarker(ctx, r.Source, WatermarkDB(r.StateSchema)); err != nil {
		return fmt.Errorf("watermark database on the source: %w", denied(err))
	}
	if _, err := r.Source.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+r.wm+` (
  id VARCHAR(64) NOT NULL,
  instance VARCHAR(255) NOT NULL,
  tbl VARCHAR(130) NOT NULL,
  chunk BIGINT NOT NULL,
  mark CHAR(1) NOT NULL,
  n BIGINT NOT NULL DEFAULT 0,
  updated_at DATETIME(6) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`); err != nil {
		return fmt.Errorf("create watermark table %s.%s on the source: %w", WatermarkDB(r.StateSchema), WatermarkTable, denied(err))
	}
	return nil
}
