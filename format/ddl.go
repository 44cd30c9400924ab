package format

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// ddlEnvelope is a schema-change record's envelope as the formats read it.
type ddlEnvelope struct {
	ChangeKey string          `json:"change_key"`
	ID        string          `json:"id"`
	Key       json.RawMessage `json:"key"`
	Source    json.RawMessage `json:"source"`
	TsMs      int64           `json:"ts_ms"`
	DDL       struct {
		Kind          string    `json:"kind"`
		Statement     string    `json:"statement"`
		DB            string    `json:"db"`
		Table         string    `json:"table"`
		OldDB         string    `json:"old_db"`
		OldTable      string    `json:"old_table"`
		Columns       *[]ddlCol `json:"columns"`
		ColumnsBefore *[]ddlCol `json:"columns_before"`
	} `json:"ddl"`
	Src struct {
		File string `json:"file"`
		Pos  uint32 `json:"pos"`
		GTID string `json:"gtid"`
		TsMs int64  `json:"ts_ms"`
	} `json:"-"`
}

type ddlCol struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Nullable bool   `json:"nullable"`
	Key      string `json:"key"`
}

func (c ddlCol) canonical() canonical.DDLColumn {
	return canonical.DDLColumn{Name: c.Name, Type: c.Type, Nullable: c.Nullable, Key: c.Key}
}

func parseDDL(rec outbox.Record) (*ddlEnvelope, error) {
	var env ddlEnvelope
	if err := json.Unmarshal(rec.Payload, &env); err != nil {
		return nil, fmt.Errorf("schema-change record %s: parse envelope: %w", rec.ID, err)
	}
	if err := json.Unmarshal(env.Source, &env.Src); err != nil {
		return nil, fmt.Errorf("schema-change record %s: parse source: %w", rec.ID, err)
	}
	return &env, nil
}

// debeziumDDL is a schema-change record in Debezium's own form. Debezium
// writes schema changes to a schema-change topic as {source, ts_ms,
// databaseName, schemaName, ddl, tableChanges: [{type, id, table}]}, and a
// TRUNCATE as a data event with op "t" on the table's topic; cdcout does
// the same, in the table's pipe (so in order with its rows), and keeps
// the delivery id, change_key and key, plus "op": "ddl" so a consumer of a
// topic carrying rows and schema changes tells them apart. A RENAME is an
// ALTER of the new id with previousId naming the old one.
func debeziumDDL(rec outbox.Record) ([]byte, error) {
	env, err := parseDDL(rec)
	if err != nil {
		return nil, err
	}
	d := env.DDL
	if d.Kind == canonical.DDLTruncate {
		return marshal(map[string]any{
			"after": nil, "before": nil, "change_key": env.ChangeKey, "id": env.ID, "key": canonical.RawJSON(env.Key),
			"op": "t", "source": canonical.RawJSON(env.Source), "ts_ms": env.TsMs,
		})
	}
	change := map[string]any{"id": debeziumID(d.DB, d.Table)}
	switch d.Kind {
	case canonical.DDLCreate:
		change["type"] = "CREATE"
	case canonical.DDLDrop:
		change["type"] = "DROP"
	default: // ALTER, RENAME
		change["type"] = "ALTER"
		if d.OldTable != "" {
			change["previousId"] = debeziumID(d.OldDB, d.OldTable)
		}
	}
	change["table"] = nil
	if d.Columns != nil {
		var pk []any
		cols := make([]any, len(*d.Columns))
		for i, c := range *d.Columns {
			if c.Key == "PRI" {
				pk = append(pk, c.Name)
			}
			cc := c.canonical()
			cols[i] = map[string]any{
				"name": c.Name, "position": i + 1, "optional": c.Nullable,
				"typeName": strings.ToUpper(cc.DataType()), "typeExpression": strings.ToUpper(c.Type),
			}
		}
		if pk == nil {
			pk = []any{}
		}
		change["table"] = map[string]any{"primaryKeyColumnNames": pk, "columns": cols}
	}
	return marshal(map[string]any{
		"change_key": env.ChangeKey, "id": env.ID, "key": canonical.RawJSON(env.Key), "op": canonical.DDLOpName,
		"source": canonical.RawJSON(env.Source), "ts_ms": env.TsMs,
		"databaseName": d.DB, "schemaName": nil, "ddl": d.Statement, "tableChanges": []any{change},
	})
}

// debeziumID is Debezium's table id: "db"."table", each part in double
// quotes.
func debeziumID(db, table string) string { return `"` + db + `"."` + table + `"` }

// maxwellDDL is a schema-change record as Maxwell writes DDL with
// --output_ddl: type table-create, table-alter or table-drop, the table's
// definition before ("old") and after ("def") with Maxwell's column
// fields (type without length, name, signed for numbers), the statement
// as "sql", ts in ms and the binlog position. A RENAME is a table-alter
// whose old and def name different tables (as Maxwell's); a TRUNCATE,
// which Maxwell does not report, is type "table-truncate".
func maxwellDDL(rec outbox.Record) ([]byte, error) {
	env, err := parseDDL(rec)
	if err != nil {
		return nil, err
	}
	d := env.DDL
	typ := map[string]string{
		canonical.DDLCreate: "table-create", canonical.DDLDrop: "table-drop",
		canonical.DDLAlter: "table-alter", canonical.DDLRename: "table-alter", canonical.DDLTruncate: "table-truncate",
	}[d.Kind]
	if typ == "" {
		return nil, fmt.Errorf("schema-change record %s: unknown kind %q", rec.ID, d.Kind)
	}
	doc := map[string]any{"type": typ, "database": d.DB, "table": d.Table, "sql": d.Statement, "ts": env.Src.TsMs}
	oldDB, oldTable := d.DB, d.Table
	if d.OldTable != "" {
		oldDB, oldTable = d.OldDB, d.OldTable
	}
	if d.ColumnsBefore != nil && d.Kind != canonical.DDLCreate {
		doc["old"] = maxwellTableDef(oldDB, oldTable, *d.ColumnsBefore)
	}
	if d.Columns != nil && d.Kind != canonical.DDLDrop {
		doc["def"] = maxwellTableDef(d.DB, d.Table, *d.Columns)
	}
	if env.Src.GTID != "" {
		doc["gtid"] = env.Src.GTID
	}
	if env.Src.File != "" {
		doc["position"] = fmt.Sprintf("%s:%d", env.Src.File, env.Src.Pos)
	}
	b, err := marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode maxwell %s: %w", rec.ID, err)
	}
	return b, nil
}

func maxwellTableDef(db, table string, cols []ddlCol) map[string]any {
	pk := []any{}
	out := make([]any, len(cols))
	for i, c := range cols {
		cc := c.canonical()
		col := map[string]any{"name": c.Name, "type": cc.DataType()}
		if isNumeric(cc.DataType()) {
			col["signed"] = !cc.Unsigned()
		}
		out[i] = col
		if c.Key == "PRI" {
			pk = append(pk, c.Name)
		}
	}
	return map[string]any{"database": db, "table": table, "columns": out, "primary-key": pk}
}

func isNumeric(dataType string) bool {
	switch dataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint", "decimal", "float", "double":
		return true
	}
	return false
}
