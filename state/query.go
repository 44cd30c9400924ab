package state

import (
	"context"
	"database/sql"
	"strings"
)

// Querier is what Collect and Strings query: a *sql.DB, *sql.Conn or
// *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Strings runs a query whose rows are one string each and returns them in
// order.
func Strings(ctx context.Context, db Querier, query string, args ...any) ([]string, error) {
	return Collect(ctx, db, query, args, func(rows *sql.Rows) (s string, err error) {
		err = rows.Scan(&s)
		return s, err
	})
}

// Collect runs a query and returns what scan makes of each row, in order
// (nil for no rows); the first error ends it.
func Collect[T any](ctx context.Context, db Querier, query string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// Placeholders is "?,?,…,?" for n arguments ("" for none).
func Placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// EscapeLike escapes s for use inside a LIKE pattern (the default escape
// character is the backslash), so a name with `_` or `%` matches only
// itself.
func EscapeLike(s string) string {
	return likeEscaper.Replace(s)
}

var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// LikePrefix is the LIKE pattern of the strings that start with p.
func LikePrefix(p string) string { return EscapeLike(p) + "%" }
