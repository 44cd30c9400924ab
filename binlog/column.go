package binlog

import "slices"

// Column describes one column of a table as a row event was written:
// enough to turn go-mysql's decoded value into a canonical value.
//
// The Stream builds Columns from the table map event when the server writes
// binlog_row_metadata=FULL, and from information_schema (cached, invalidated
// by DDL) otherwise. Either way Decode is the one place that decides a
// type's canonical form.
type Column struct {
	Name string
	// Type is the binlog column type (mysql.MYSQL_TYPE_*), after resolving
	// MYSQL_TYPE_STRING's real type (ENUM/SET are stored as STRING).
	Type byte
	// Meta is the table map's metadata for the column (length, precision,
	// fractional digits…), as go-mysql passes it around.
	Meta     uint16
	Unsigned bool
	// Charset is the character set of a character column ("utf8mb4",
	// "latin1", …); "binary" (or "") for binary strings and BLOBs.
	Charset string
	// Decimals is the fractional-second digits of TIME/DATETIME/TIMESTAMP
	// and the scale of DECIMAL.
	Decimals int
	// EnumValues / SetValues name the members of ENUM / SET columns.
	EnumValues []string
	SetValues  []string
	// JSON is true for JSON columns, including MariaDB's JSON alias
	// (LONGTEXT with a json_valid check).
	JSON bool
	// Geometry is true for spatial columns.
	Geometry bool
	// Nullable as declared (informational).
	Nullable bool
}

// Table is the decoding schema of one table at one point in the binlog.
type Table struct {
	DB, Name string
	Columns  []Column
	// KeyColumns index Columns: the primary key, else the first unique key
	// whose columns are all NOT NULL; empty when the table has neither.
	KeyColumns []int
	// KeyNames are the key columns' names, sorted: a change's KeyCols.
	KeyNames []string
}

// setKey sets KeyColumns and the sorted KeyNames.
func (t *Table) setKey(idx []int) {
	t.KeyColumns = idx
	t.KeyNames = nil
	for _, k := range idx {
		t.KeyNames = append(t.KeyNames, t.Columns[k].Name)
	}
	slices.Sort(t.KeyNames)
}
