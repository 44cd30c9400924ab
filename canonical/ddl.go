package canonical

import "strings"

// OpDDL is the op of a schema-change record: one DDL statement on a
// captured table (ALTER, RENAME, DROP, TRUNCATE, CREATE), for sinks with
// ddl: true. It is stored as this letter (the outbox's op column); the
// envelope spells it DDLOpName.
const OpDDL Op = "s"

// DDLOpName is OpDDL in the envelope: "op":"ddl".
const DDLOpName = "ddl"

// The kinds of schema change (DDL.Kind).
const (
	DDLCreate   = "CREATE"
	DDLAlter    = "ALTER"
	DDLRename   = "RENAME"
	DDLDrop     = "DROP"
	DDLTruncate = "TRUNCATE"
)

// DDL is what a schema-change record says (the envelope's "ddl").
type DDL struct {
	// Kind is one of the DDL* kinds; Statement the statement as the
	// binlog carries it.
	Kind, Statement string
	// DB and Table name the table after the statement; OldDB and
	// OldTable its name before a RENAME ("" otherwise).
	DB, Table, OldDB, OldTable string
	// Columns is the table's column list after the statement (nil after
	// a DROP, or when the table is gone by the time the statement is
	// read); ColumnsBefore the list before it, nil when not known.
	Columns, ColumnsBefore []DDLColumn
}

// DDLColumn is one column of a table definition, as information_schema
// describes it.
type DDLColumn struct {
	Name string
	// Type is the MySQL column type (COLUMN_TYPE: "int unsigned",
	// "varchar(32)", "enum('a','b')").
	Type     string
	Nullable bool
	// Key is the column's key membership (COLUMN_KEY): "PRI", "UNI",
	// "MUL" or "".
	Key string
}

// DataType is the type's name without its length, members or
// attributes: "varchar" for "varchar(32)", "int" for "int unsigned".
func (c DDLColumn) DataType() string {
	t := c.Type
	if i := strings.IndexAny(t, "( "); i >= 0 {
		t = t[:i]
	}
	return strings.ToLower(t)
}

// Unsigned reports an unsigned numeric type.
func (c DDLColumn) Unsigned() bool {
	t := strings.ToLower(c.Type)
	return !strings.HasPrefix(t, "enum") && !strings.HasPrefix(t, "set") && strings.Contains(t, " unsigned")
}

// DDLKey is the row key of a schema-change record: the table it
// concerns, so a keyed sink (Kafka) puts a table's schema changes on one
// partition.
func DDLKey(db, table string) Row { return Row{"db": db, "table": table} }

func columnsDoc(cols []DDLColumn) any {
	if cols == nil {
		return nil
	}
	out := make([]any, len(cols))
	for i, c := range cols {
		out[i] = map[string]any{"name": c.Name, "type": c.Type, "nullable": c.Nullable, "key": c.Key}
	}
	return out
}

func (d *DDL) doc() map[string]any {
	m := map[string]any{
		"kind": d.Kind, "statement": d.Statement, "db": d.DB, "table": d.Table,
		"columns": columnsDoc(d.Columns), "columns_before": columnsDoc(d.ColumnsBefore),
	}
	if d.OldTable != "" {
		m["old_db"], m["old_table"] = d.OldDB, d.OldTable
	}
	return m
}
