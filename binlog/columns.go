package binlog

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/state"
)

// TableColumnsOf is one source table's column names, as information_schema
// describes the table now.
type TableColumnsOf struct {
	DB, Table string
	Columns   []string
}

// TableColumns lists the columns of every base table of the source dsn
// names, leaving out the system databases and cdcout's own (those with a
// state.MarkerTable), which are never captured. Sinks check their key:
// and name-template columns against it at start-up.
func TableColumns(ctx context.Context, dsn string) ([]TableColumnsOf, error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s@%s: %w", cfg.User, cfg.Addr, err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT c.TABLE_SCHEMA, c.TABLE_NAME, c.COLUMN_NAME
FROM information_schema.COLUMNS c JOIN information_schema.TABLES t
  ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME AND t.TABLE_TYPE = 'BASE TABLE'
WHERE c.TABLE_SCHEMA NOT IN ('mysql', 'sys', 'information_schema', 'performance_schema')
  AND c.TABLE_SCHEMA NOT IN (SELECT TABLE_SCHEMA FROM information_schema.TABLES WHERE TABLE_NAME = ?)
ORDER BY c.TABLE_SCHEMA, c.TABLE_NAME, c.ORDINAL_POSITION`, state.MarkerTable)
	if err != nil {
		return nil, fmt.Errorf("read source columns: %w", err)
	}
	defer rows.Close()
	var out []TableColumnsOf
	for rows.Next() {
		var dbName, table, col string
		if err := rows.Scan(&dbName, &table, &col); err != nil {
			return nil, fmt.Errorf("read source columns: %w", err)
		}
		if n := len(out); n == 0 || out[n-1].DB != dbName || out[n-1].Table != table {
			out = append(out, TableColumnsOf{DB: dbName, Table: table})
		}
		out[len(out)-1].Columns = append(out[len(out)-1].Columns, col)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read source columns: %w", err)
	}
	return out, nil
}
