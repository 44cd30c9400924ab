package backfill

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
)

// ErrBadInput marks a problem the operator fixes by changing the command
// line (unknown table, no usable key, failing --where): nothing was read or
// enqueued.
var ErrBadInput = errors.New("bad backfill input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// column is one column as the chunk reader converts it.
type column struct {
	name      string
	dataType  string // information_schema DATA_TYPE, lower case
	unsigned  bool
	binary    bool // binary charset: bytes, base64 in JSON
	json      bool
	precision int // fractional seconds
	setType   bool
}

// tableInfo is what a backfill needs of its table.
type tableInfo struct {
	db, name string
	cols     []column
	key      []int // indexes into cols, in key order
	estimate int64 // information_schema TABLE_ROWS
}

func (t *tableInfo) qualified() string { return quoteIdent(t.db) + "." + quoteIdent(t.name) }

func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

var jsonCheckRe = regexp.MustCompile("(?i)^json_valid\\(`((?:[^`]|``)+)`\\)$")

// loadTable reads the columns, the key (primary, else the first unique key
// whose columns are all NOT NULL, the binlog decoder's choice) and the row
// estimate of db.name.
func loadTable(ctx context.Context, db *sql.DB, schema, name string) (*tableInfo, error) {
	t := &tableInfo{db: schema, name: name}
	var estimate sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT TABLE_ROWS FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND TABLE_TYPE = 'BASE TABLE'`, schema, name).Scan(&estimate)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, badInput("table %s.%s does not exist on the source (or is a view)", schema, name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up table %s.%s: %w", schema, name, err)
	}
	t.estimate = estimate.Int64
	rows, err := db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COALESCE(CHARACTER_SET_NAME, ''),
		COALESCE(DATETIME_PRECISION, 0)
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, schema, name)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, name, err)
	}
	byName := map[string]int{}
	for rows.Next() {
		var c column
		var colType, charset string
		if err := rows.Scan(&c.name, &c.dataType, &colType, &charset, &c.precision); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read columns of %s.%s: %w", schema, name, err)
		}
		c.dataType = strings.ToLower(c.dataType)
		c.unsigned = strings.Contains(strings.ToLower(colType), "unsigned")
		c.binary = charset == "" || charset == "binary"
		c.json = c.dataType == "json"
		c.setType = c.dataType == "set"
		byName[c.name] = len(t.cols)
		t.cols = append(t.cols, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, name, err)
	}
	// MariaDB's JSON is LONGTEXT with CHECK (json_valid(col)); the binlog
	// decoder embeds it as JSON, so must we. MySQL has no TABLE_NAME here:
	// the query fails and its JSON type is already "json".
	if crows, err := db.QueryContext(ctx, `SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
		WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?`, schema, name); err == nil {
		for crows.Next() {
			var clause string
			if crows.Scan(&clause) == nil {
				if m := jsonCheckRe.FindStringSubmatch(strings.TrimSpace(clause)); m != nil {
					if i, ok := byName[strings.ReplaceAll(m[1], "``", "`")]; ok {
						t.cols[i].json = true
					}
				}
			}
		}
		crows.Close()
	}

	keyCols, err := binlog.KeyColumnNames(ctx, db, schema, name)
	if err != nil {
		return nil, err
	}
	for _, c := range keyCols {
		t.key = append(t.key, byName[c])
	}
	if len(t.key) == 0 {
		return nil, badInput("table %s.%s has no primary key and no unique key on NOT NULL columns: a backfill reads in key order and identifies rows by key; add one, e.g. ALTER TABLE %s ADD PRIMARY KEY (…)",
			schema, name, t.qualified())
	}
	return t, nil
}

// convert turns a column value as the server sent it (text form, nil for
// NULL) into the canonical value the binlog decoder produces for the same
// column, so a backfilled row and a streamed one look alike.
func (c *column) convert(raw []byte) (any, error) {
	if raw == nil {
		return nil, nil
	}
	s := string(raw)
	switch c.dataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year":
		if c.unsigned {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", c.name, err)
			}
			return n, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
		return n, nil
	case "decimal", "numeric":
		return s, nil
	case "float":
		f, err := strconv.ParseFloat(s, 32)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
		return float32(f), nil
	case "double", "real":
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
		return f, nil
	case "bit":
		var n uint64
		for _, b := range raw {
			n = n<<8 | uint64(b)
		}
		return n, nil
	case "date", "time":
		return s, nil
	case "datetime", "timestamp":
		// The session runs with time_zone '+00:00', so TIMESTAMP text is
		// UTC; the server prints exactly the column's fractional digits.
		if len(s) >= 19 && s[10] == ' ' {
			s = s[:10] + "T" + s[11:]
		}
		if c.dataType == "timestamp" {
			s += "Z"
		}
		return s, nil
	case "set":
		out := []any{}
		if s != "" {
			for _, m := range strings.Split(s, ",") {
				out = append(out, m)
			}
		}
		return out, nil
	case "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection":
		return append([]byte(nil), raw...), nil
	}
	if c.json {
		return canonical.RawJSON(append([]byte(nil), raw...)), nil
	}
	if c.binary || !utf8.Valid(raw) {
		return append([]byte(nil), raw...), nil
	}
	return s, nil
}

// keyArgs are the SQL arguments of a key position: the key columns' values
// as the server sent them. They are stored base64-encoded (binary keys are
// not text) so a resumed backfill continues exactly after the last key.
type keyArgs [][]byte

func (k keyArgs) encode() string {
	parts := make([]string, len(k))
	for i, b := range k {
		parts[i] = base64.StdEncoding.EncodeToString(b)
	}
	return strings.Join(parts, ",")
}

func decodeKeyArgs(s string) (keyArgs, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make(keyArgs, len(parts))
	for i, p := range parts {
		b, err := base64.StdEncoding.DecodeString(p)
		if err != nil {
			return nil, fmt.Errorf("decode stored key: %w", err)
		}
		out[i] = b
	}
	return out, nil
}

// afterKey is the predicate "row key > after" in expanded OR form
// (a > ? OR (a = ? AND b > ?) …), which every MySQL and MariaDB version
// turns into an index range, unlike a row-constructor comparison on some.
func (t *tableInfo) afterKey(after keyArgs) (string, []any) {
	var or []string
	var args []any
	for i := range t.key {
		var and []string
		for j := 0; j < i; j++ {
			and = append(and, quoteIdent(t.cols[t.key[j]].name)+" = ?")
			args = append(args, string(after[j]))
		}
		and = append(and, quoteIdent(t.cols[t.key[i]].name)+" > ?")
		args = append(args, string(after[i]))
		or = append(or, "("+strings.Join(and, " AND ")+")")
	}
	return "(" + strings.Join(or, " OR ") + ")", args
}

// atMostKey is "row key <= upTo", for re-reading a chunk's range.
func (t *tableInfo) atMostKey(upTo keyArgs) (string, []any) {
	cond, args := t.afterKey(upTo)
	return "NOT " + cond, args
}

func (t *tableInfo) orderBy() string {
	parts := make([]string, len(t.key))
	for i, k := range t.key {
		parts[i] = quoteIdent(t.cols[k].name)
	}
	return strings.Join(parts, ", ")
}

func (t *tableInfo) selectList() string {
	parts := make([]string, len(t.cols))
	for i, c := range t.cols {
		parts[i] = quoteIdent(c.name)
	}
	return strings.Join(parts, ", ")
}
