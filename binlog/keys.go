package binlog

import (
	"context"
	"database/sql"
	"fmt"
)

// KeyColumnNames returns the columns that identify a row of db.table: the
// primary key, else the first unique index whose columns are all NOT NULL
// (what InnoDB itself promotes to the clustered key), in index name order
// so every replica, and the backfill, pick the same one. It returns nil
// when the table has neither.
func KeyColumnNames(ctx context.Context, q *sql.DB, db, table string) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, NULLABLE
		FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?
		ORDER BY INDEX_NAME <> 'PRIMARY', INDEX_NAME, SEQ_IN_INDEX`, db, table)
	if err != nil {
		return nil, fmt.Errorf("read keys of %s.%s: %w", db, table, err)
	}
	defer rows.Close()
	type index struct {
		cols     []string
		nullable bool
	}
	var order []string
	indexes := map[string]*index{}
	for rows.Next() {
		var idx, col, nullable string
		var nonUnique int
		if err := rows.Scan(&idx, &nonUnique, &col, &nullable); err != nil {
			return nil, fmt.Errorf("read keys of %s.%s: %w", db, table, err)
		}
		if nonUnique != 0 {
			continue
		}
		ix, ok := indexes[idx]
		if !ok {
			ix = &index{}
			indexes[idx] = ix
			order = append(order, idx)
		}
		ix.cols = append(ix.cols, col)
		ix.nullable = ix.nullable || nullable == "YES"
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read keys of %s.%s: %w", db, table, err)
	}
	for _, name := range order {
		if ix := indexes[name]; !ix.nullable {
			return ix.cols, nil
		}
	}
	return nil, nil
}
