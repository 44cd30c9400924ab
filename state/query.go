package state

import (
	"context"
	"database/sql"
	"strings"
)

// Strings runs a query whose rows are one string each and returns them in
// order.
func Strings(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
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
