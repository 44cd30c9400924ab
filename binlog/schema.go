package binlog

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
)

// schemaCache turns table map events into decoding schemas (Table).
//
// In "binlog" mode (binlog_row_metadata=FULL) names, signedness, charsets,
// ENUM/SET members and the primary key come from the table map itself, so
// every row decodes with the schema it was written under, whatever DDL ran
// since. information_schema still supplies what the binlog does not carry:
// MariaDB's JSON alias (LONGTEXT with a json_valid check) and, for tables
// without a primary key, the first NOT NULL unique key; both are looked up
// by column name in the table's current definition.
//
// In "information_schema" mode everything but the physical types comes from
// information_schema, which describes the table as it is now, not as it was
// when the event was written. The cache is dropped at every DDL event, so a
// reader that is caught up sees each definition in turn. A reader that lags
// behind a DDL can only notice the difference: when the column count or a
// column's type no longer matches the table map, the row is refused with an
// error rather than decoded under the wrong names. A change that keeps count
// and types (renaming a column, swapping two columns of one type) cannot be
// detected in this mode; that is why FULL metadata is the supported setup.
type schemaCache struct {
	db         *sql.DB
	log        *zap.Logger
	mariadb    bool
	fullMeta   bool
	collations map[uint64]string

	info map[string]*tableInfo // "db.tbl" → information_schema description
	// cols is the column list last seen per table ("db.tbl"), kept across
	// DDL: a schema-change record's list before (ddlrecord.go).
	cols map[string][]canonical.DDLColumn
	// mapped is the table last decoded from a table map per table, since
	// its last DDL: what the binlog itself says the table was.
	mapped map[string]*Table
	// known are the tables of each database the stream decoded a table
	// map of or read a schema change of: a DROP DATABASE's (ddlrecord.go).
	known map[string]map[string]bool
	// ddlAfter: schema-change records' lists after, to check against the
	// next table map (ddlrecord.go).
	ddlAfter map[string]ddlAfter
	byID     map[uint64]*mappedTable
	keyless  map[string]bool // tables already reported as keyless
}

// mappedTable is a decoded table map, reused while the server keeps sending
// identical table maps for the same table id.
type mappedTable struct {
	tm    *replication.TableMapEvent
	table *Table
}

// tableInfo is a table's current definition from information_schema.
type tableInfo struct {
	cols   []isColumn
	byName map[string]int
	key    []string        // key column names (primary, else first NOT NULL unique)
	json   map[string]bool // MariaDB JSON alias columns
}

type isColumn struct {
	name, dataType, columnType string
	charset, key               string
	scale, precision           int
	nullable                   bool
}

func newSchemaCache(db *sql.DB, log *zap.Logger, mariadb, fullMeta bool, collations map[uint64]string) *schemaCache {
	return &schemaCache{
		db: db, log: log, mariadb: mariadb, fullMeta: fullMeta, collations: collations,
		info: map[string]*tableInfo{}, byID: map[uint64]*mappedTable{}, keyless: map[string]bool{},
		cols: map[string][]canonical.DDLColumn{}, mapped: map[string]*Table{},
		known: map[string]map[string]bool{}, ddlAfter: map[string]ddlAfter{},
	}
}

// invalidate forgets every cached definition. DDL is rare, so dropping all
// of it is cheaper than parsing which tables a statement touched, and it
// cannot miss one (RENAME across databases, multi-table DROP…).
func (c *schemaCache) invalidate() {
	clear(c.info)
	clear(c.byID)
}

// isDDL reports whether a query event may change a table definition.
func isDDL(q []byte) bool {
	switch firstWord(q) {
	case "ALTER", "RENAME", "DROP", "TRUNCATE", "CREATE":
		return true
	}
	return false
}

// opensTransaction reports a statement logged outside BEGIN that a COMMIT
// or XID still ends: MySQL 8.0.21+ writes an atomic CREATE TABLE … SELECT
// as "CREATE TABLE … START TRANSACTION" followed by the rows and an XID.
func opensTransaction(q []byte) bool {
	return firstWord(q) == "CREATE" && bytes.HasSuffix(bytes.TrimSpace(q), []byte("START TRANSACTION"))
}

// dmlVerb returns the statement's verb when it is a row-changing statement
// (INSERT, UPDATE, DELETE, REPLACE, LOAD), else "".
func dmlVerb(q []byte) string {
	w := firstWord(q)
	switch w {
	case "INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD":
		return w
	}
	return ""
}

func firstWord(q []byte) string {
	q = bytes.TrimSpace(q)
	for bytes.HasPrefix(q, []byte("/*")) {
		end := bytes.Index(q, []byte("*/"))
		if end < 0 {
			return ""
		}
		q = bytes.TrimSpace(q[end+2:])
	}
	if i := bytes.IndexAny(q, " \t\r\n("); i >= 0 {
		q = q[:i]
	}
	return strings.ToUpper(string(q))
}

func sameMap(a, b *replication.TableMapEvent) bool {
	if a.ColumnCount != b.ColumnCount || !bytes.Equal(a.ColumnType, b.ColumnType) ||
		!bytes.Equal(a.Schema, b.Schema) || !bytes.Equal(a.Table, b.Table) || len(a.ColumnName) != len(b.ColumnName) {
		return false
	}
	for i := range a.ColumnMeta {
		if a.ColumnMeta[i] != b.ColumnMeta[i] {
			return false
		}
	}
	for i := range a.ColumnName {
		if !bytes.Equal(a.ColumnName[i], b.ColumnName[i]) {
			return false
		}
	}
	return true
}

// table returns the decoding schema for a table map event.
func (c *schemaCache) table(ctx context.Context, tm *replication.TableMapEvent) (*Table, error) {
	if m, ok := c.byID[tm.TableID]; ok && (m.tm == tm || sameMap(m.tm, tm)) {
		m.tm = tm
		return m.table, nil
	}
	var t *Table
	var err error
	if c.fullMeta && len(tm.ColumnName) == int(tm.ColumnCount) {
		t, err = c.fromTableMap(ctx, tm)
	} else {
		t, err = c.fromInformationSchema(ctx, tm)
	}
	if err != nil {
		return nil, err
	}
	if len(t.KeyColumns) == 0 {
		name := t.DB + "." + t.Name
		if !c.keyless[name] {
			c.keyless[name] = true
			c.log.Warn("table has no primary key and no NOT NULL unique key; its changes are emitted with key null",
				zap.String("table", name))
		}
	}
	c.byID[tm.TableID] = &mappedTable{tm: tm, table: t}
	c.mapped[t.DB+"."+t.Name] = t
	c.know(t.DB, t.Name)
	c.checkDDLAfter(t)
	return t, nil
}

// realType resolves MYSQL_TYPE_STRING, which also carries ENUM and SET.
func realType(tm *replication.TableMapEvent, i int) byte {
	t := tm.ColumnType[i]
	if t == gomysql.MYSQL_TYPE_STRING {
		if rt := byte(tm.ColumnMeta[i] >> 8); rt == gomysql.MYSQL_TYPE_ENUM || rt == gomysql.MYSQL_TYPE_SET {
			return rt
		}
	}
	return t
}

// metaDecimals is the scale or fractional-second digits the table map's
// metadata carries for a column.
func metaDecimals(typ byte, meta uint16) int {
	switch typ {
	case gomysql.MYSQL_TYPE_NEWDECIMAL:
		return int(meta & 0xff)
	case gomysql.MYSQL_TYPE_TIME2, gomysql.MYSQL_TYPE_DATETIME2, gomysql.MYSQL_TYPE_TIMESTAMP2:
		return int(meta)
	}
	return 0
}

func (c *schemaCache) charset(coll uint64, ok bool) string {
	if !ok {
		return ""
	}
	if cs, found := c.collations[coll]; found {
		return cs
	}
	return ""
}

func (c *schemaCache) fromTableMap(ctx context.Context, tm *replication.TableMapEvent) (*Table, error) {
	t := &Table{DB: string(tm.Schema), Name: string(tm.Table), Columns: make([]Column, tm.ColumnCount)}
	names := tm.ColumnNameString()
	unsigned := tm.UnsignedMap()
	colls := tm.CollationMap()
	esColls := tm.EnumSetCollationMap()
	enums := tm.EnumStrValueMap()
	sets := tm.SetStrValueMap()
	// information_schema only for what the table map lacks; a table that
	// is gone by now simply has no JSON alias columns or unique keys.
	var info *tableInfo
	needInfo := c.mariadb || len(tm.PrimaryKey) == 0
	if needInfo {
		var err error
		if info, err = c.lookup(ctx, t.DB, t.Name); err != nil {
			return nil, err
		}
	}
	for i := range t.Columns {
		typ := realType(tm, i)
		col := Column{
			Name:     names[i],
			Type:     typ,
			Meta:     tm.ColumnMeta[i],
			Unsigned: unsigned[i],
			Decimals: metaDecimals(typ, tm.ColumnMeta[i]),
			Geometry: typ == gomysql.MYSQL_TYPE_GEOMETRY,
			JSON:     typ == gomysql.MYSQL_TYPE_JSON,
		}
		if coll, ok := colls[i]; ok {
			col.Charset = c.charset(coll, ok)
		} else if coll, ok := esColls[i]; ok {
			col.Charset = c.charset(coll, ok)
		}
		if typ == gomysql.MYSQL_TYPE_ENUM {
			col.EnumValues = enums[i]
		}
		if typ == gomysql.MYSQL_TYPE_SET {
			col.SetValues = sets[i]
		}
		if _, nullable := tm.Nullable(i); nullable {
			col.Nullable = true
		}
		if info != nil && info.json[col.Name] && typ == gomysql.MYSQL_TYPE_BLOB {
			col.JSON = true
		}
		t.Columns[i] = col
	}
	if len(tm.PrimaryKey) > 0 {
		var idx []int
		for _, k := range tm.PrimaryKey {
			idx = append(idx, int(k))
		}
		t.setKey(idx)
	} else if info != nil {
		t.setKey(keyIndexes(info.key, names))
	}
	return t, nil
}

// keyIndexes maps key column names to positions; nil when any is missing
// (the key changed since the event was written, so it cannot be trusted).
func keyIndexes(key, names []string) []int {
	if len(key) == 0 {
		return nil
	}
	idx := make([]int, 0, len(key))
	for _, k := range key {
		found := -1
		for i, n := range names {
			if strings.EqualFold(n, k) {
				found = i
				break
			}
		}
		if found < 0 {
			return nil
		}
		idx = append(idx, found)
	}
	return idx
}

// compatible reports whether an information_schema DATA_TYPE can describe a
// column of binlog type typ. Unknown data types are accepted.
func compatible(dataType string, typ byte) bool {
	want := map[string][]byte{
		"tinyint":    {gomysql.MYSQL_TYPE_TINY},
		"smallint":   {gomysql.MYSQL_TYPE_SHORT},
		"mediumint":  {gomysql.MYSQL_TYPE_INT24},
		"int":        {gomysql.MYSQL_TYPE_LONG},
		"bigint":     {gomysql.MYSQL_TYPE_LONGLONG},
		"decimal":    {gomysql.MYSQL_TYPE_NEWDECIMAL, gomysql.MYSQL_TYPE_DECIMAL},
		"float":      {gomysql.MYSQL_TYPE_FLOAT},
		"double":     {gomysql.MYSQL_TYPE_DOUBLE},
		"bit":        {gomysql.MYSQL_TYPE_BIT},
		"date":       {gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_NEWDATE},
		"datetime":   {gomysql.MYSQL_TYPE_DATETIME, gomysql.MYSQL_TYPE_DATETIME2},
		"timestamp":  {gomysql.MYSQL_TYPE_TIMESTAMP, gomysql.MYSQL_TYPE_TIMESTAMP2},
		"time":       {gomysql.MYSQL_TYPE_TIME, gomysql.MYSQL_TYPE_TIME2},
		"year":       {gomysql.MYSQL_TYPE_YEAR},
		"char":       {gomysql.MYSQL_TYPE_STRING},
		"binary":     {gomysql.MYSQL_TYPE_STRING},
		"varchar":    {gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING},
		"varbinary":  {gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING},
		"enum":       {gomysql.MYSQL_TYPE_ENUM},
		"set":        {gomysql.MYSQL_TYPE_SET},
		"tinytext":   {gomysql.MYSQL_TYPE_BLOB},
		"text":       {gomysql.MYSQL_TYPE_BLOB},
		"mediumtext": {gomysql.MYSQL_TYPE_BLOB},
		"longtext":   {gomysql.MYSQL_TYPE_BLOB},
		"tinyblob":   {gomysql.MYSQL_TYPE_BLOB},
		"blob":       {gomysql.MYSQL_TYPE_BLOB},
		"mediumblob": {gomysql.MYSQL_TYPE_BLOB},
		"longblob":   {gomysql.MYSQL_TYPE_BLOB},
		"json":       {gomysql.MYSQL_TYPE_JSON, gomysql.MYSQL_TYPE_BLOB},
	}
	switch dataType {
	case "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection", "geomcollection":
		return typ == gomysql.MYSQL_TYPE_GEOMETRY
	}
	types, ok := want[dataType]
	if !ok {
		return true
	}
	for _, t := range types {
		if t == typ {
			return true
		}
	}
	return false
}

func (c *schemaCache) fromInformationSchema(ctx context.Context, tm *replication.TableMapEvent) (*Table, error) {
	db, name := string(tm.Schema), string(tm.Table)
	info, err := c.lookup(ctx, db, name)
	if err != nil {
		return nil, err
	}
	if info == nil || len(info.cols) == 0 {
		return nil, fmt.Errorf("table %s.%s: not in information_schema any more (dropped or renamed since this event was written) "+
			"and the binlog carries no column names (binlog_row_metadata is not FULL): cannot decode its rows; "+
			"enable binlog_row_metadata=FULL, or start after this position and re-backfill the table", db, name)
	}
	mismatch := len(info.cols) != int(tm.ColumnCount)
	if !mismatch {
		for i, col := range info.cols {
			if !compatible(col.dataType, realType(tm, i)) {
				mismatch = true
				break
			}
		}
	}
	if mismatch {
		have := make([]string, len(info.cols))
		for i, col := range info.cols {
			have[i] = col.name + " " + col.dataType
		}
		return nil, fmt.Errorf("table %s.%s: the binlog row has %d columns but information_schema now describes %d (%s): "+
			"the table changed after this event was written and binlog_row_metadata is not FULL, so its rows cannot be decoded "+
			"under the right names; enable binlog_row_metadata=FULL, or start after the DDL and re-backfill the table",
			db, name, tm.ColumnCount, len(info.cols), strings.Join(have, ", "))
	}
	t := &Table{DB: db, Name: name, Columns: make([]Column, tm.ColumnCount)}
	names := make([]string, len(info.cols))
	// binlog_row_metadata=MINIMAL carries the signedness: it, not today's
	// information_schema, says how the event's integers were stored, and
	// the Stream has go-mysql decode them signed (decodeTableMap).
	unsigned := tm.UnsignedMap()
	for i, ic := range info.cols {
		typ := realType(tm, i)
		col := Column{
			Name: ic.name,
			Type: typ,
			Meta: tm.ColumnMeta[i],
			Unsigned: !strings.HasPrefix(ic.columnType, "enum") && !strings.HasPrefix(ic.columnType, "set") &&
				strings.Contains(strings.ToLower(ic.columnType), "unsigned"),
			Charset:  ic.charset,
			Decimals: metaDecimals(typ, tm.ColumnMeta[i]),
			Geometry: typ == gomysql.MYSQL_TYPE_GEOMETRY,
			JSON:     typ == gomysql.MYSQL_TYPE_JSON || ic.dataType == "json" || info.json[ic.name],
			Nullable: ic.nullable,
		}
		if unsigned != nil && tm.IsNumericColumn(i) {
			col.Unsigned = unsigned[i]
		}
		switch typ {
		case gomysql.MYSQL_TYPE_NEWDECIMAL:
			col.Decimals = ic.scale
		case gomysql.MYSQL_TYPE_TIME2, gomysql.MYSQL_TYPE_DATETIME2, gomysql.MYSQL_TYPE_TIMESTAMP2:
			col.Decimals = ic.precision
		case gomysql.MYSQL_TYPE_ENUM:
			col.EnumValues = parseEnumValues(ic.columnType)
		case gomysql.MYSQL_TYPE_SET:
			col.SetValues = parseEnumValues(ic.columnType)
		}
		if col.Charset == "" && isStringType(typ) {
			col.Charset = "binary"
		}
		t.Columns[i] = col
		names[i] = ic.name
	}
	t.setKey(keyIndexes(info.key, names))
	return t, nil
}

func isStringType(typ byte) bool {
	switch typ {
	case gomysql.MYSQL_TYPE_STRING, gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING, gomysql.MYSQL_TYPE_BLOB:
		return true
	}
	return false
}

// parseEnumValues reads the members from "enum('a','b”c')" / "set(…)".
func parseEnumValues(columnType string) []string {
	open := strings.IndexByte(columnType, '(')
	if open < 0 {
		return nil
	}
	s := columnType[open+1:]
	var vals []string
	for {
		s = strings.TrimLeft(s, ", ")
		if len(s) == 0 || s[0] != '\'' {
			return vals
		}
		var b strings.Builder
		i := 1
		for i < len(s) {
			if s[i] == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					b.WriteByte('\'')
					i += 2
					continue
				}
				break
			}
			if s[i] == '\\' && i+1 < len(s) {
				b.WriteByte(s[i+1])
				i += 2
				continue
			}
			b.WriteByte(s[i])
			i++
		}
		vals = append(vals, b.String())
		if i >= len(s) {
			return vals
		}
		s = s[i+1:]
	}
}

var jsonCheckRe = regexp.MustCompile("(?i)^json_valid\\(`((?:[^`]|``)+)`\\)$")

// lookup reads (and caches) a table's current definition. A missing table
// yields an empty tableInfo, not an error.
func (c *schemaCache) lookup(ctx context.Context, db, name string) (*tableInfo, error) {
	key := db + "." + name
	if info, ok := c.info[key]; ok {
		return info, nil
	}
	info := &tableInfo{byName: map[string]int{}, json: map[string]bool{}}
	rows, err := c.db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COALESCE(CHARACTER_SET_NAME, ''),
		COALESCE(NUMERIC_SCALE, 0), COALESCE(DATETIME_PRECISION, 0), IS_NULLABLE, COLUMN_KEY
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, db, name)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", key, err)
	}
	for rows.Next() {
		var col isColumn
		var nullable string
		if err := rows.Scan(&col.name, &col.dataType, &col.columnType, &col.charset, &col.scale, &col.precision, &nullable, &col.key); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read columns of %s: %w", key, err)
		}
		col.dataType = strings.ToLower(col.dataType)
		col.nullable = nullable == "YES"
		info.byName[col.name] = len(info.cols)
		info.cols = append(info.cols, col)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", key, err)
	}

	if info.key, err = KeyColumnNames(ctx, c.db, db, name); err != nil {
		return nil, err
	}

	if c.mariadb {
		// MariaDB's JSON is LONGTEXT plus CHECK (json_valid(col)).
		rows, err := c.db.QueryContext(ctx, `SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
			WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?`, db, name)
		if err == nil {
			for rows.Next() {
				var clause string
				if rows.Scan(&clause) == nil {
					if m := jsonCheckRe.FindStringSubmatch(strings.TrimSpace(clause)); m != nil {
						info.json[strings.ReplaceAll(m[1], "``", "`")] = true
					}
				}
			}
			rows.Close()
		} else {
			c.log.Warn("cannot read check constraints; MariaDB JSON columns will decode as text", zap.String("table", key), zap.Error(err))
		}
	}
	c.info[key] = info
	if _, ok := c.cols[key]; !ok && len(info.cols) > 0 {
		cols := make([]canonical.DDLColumn, len(info.cols))
		for i, ic := range info.cols {
			cols[i] = canonical.DDLColumn{Name: ic.name, Type: ic.columnType, Nullable: ic.nullable, Key: ic.key}
		}
		c.setCols(db, name, cols)
	}
	return info, nil
}
