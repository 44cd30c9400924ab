package binlog

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/replication"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
)

// ddlDropDatabase is the kind of a DROP DATABASE target (ddlTargets),
// which names the database only: ddlRecords makes it a DROP of each table
// of it the stream knows.
const ddlDropDatabase = "DROP DATABASE"

// ddlTarget is one table a DDL statement changes.
type ddlTarget struct {
	kind            string // canonical.DDL*
	db, table       string
	oldDB, oldTable string // RENAME: the name before
}

// ddlTargets parses the tables a DDL statement creates, alters, renames,
// drops or truncates (defaultDB for unqualified names):
//
//	CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t …
//	CREATE [OR REPLACE] [UNIQUE|FULLTEXT|SPATIAL] INDEX [IF NOT EXISTS] i … ON t …   (ALTER of t)
//	ALTER [ONLINE] [IGNORE] TABLE [IF EXISTS] t … [RENAME [TO|AS] t2]
//	RENAME TABLE a TO b [, c TO d …]
//	DROP TABLE [IF EXISTS] t1 [, t2 …]
//	DROP INDEX [IF EXISTS] i ON t                                            (ALTER of t)
//	DROP {DATABASE|SCHEMA} [IF EXISTS] d                                     (ddlDropDatabase)
//	TRUNCATE [TABLE] t
//
// TEMPORARY tables, views and every other statement give nothing. Names
// are plain or backquoted, optionally db-qualified.
func ddlTargets(q, defaultDB string) []ddlTarget {
	p := &ddlParser{toks: ddlTokens(q), defaultDB: defaultDB}
	switch p.word() {
	case "CREATE":
		p.skip("OR", "REPLACE")
		switch p.word() {
		case "TABLE":
			p.skip("IF", "NOT", "EXISTS")
			if db, t, ok := p.name(); ok {
				return []ddlTarget{{kind: canonical.DDLCreate, db: db, table: t}}
			}
		case "UNIQUE", "FULLTEXT", "SPATIAL":
			if p.word() == "INDEX" {
				return p.indexTarget()
			}
		case "INDEX":
			return p.indexTarget()
		}
	case "DROP":
		switch p.word() {
		case "TABLE":
			p.skip("IF", "EXISTS")
			var out []ddlTarget
			for {
				db, t, ok := p.name()
				if !ok {
					return out
				}
				out = append(out, ddlTarget{kind: canonical.DDLDrop, db: db, table: t})
				if !p.punct(",") {
					return out
				}
			}
		case "INDEX":
			return p.indexTarget()
		case "DATABASE", "SCHEMA":
			p.skip("IF", "EXISTS")
			if p.i < len(p.toks) && (p.toks[p.i].quoted || isIdent(p.toks[p.i].s)) {
				return []ddlTarget{{kind: ddlDropDatabase, db: p.toks[p.i].s}}
			}
		}
	case "TRUNCATE":
		p.skip("TABLE")
		if db, t, ok := p.name(); ok {
			return []ddlTarget{{kind: canonical.DDLTruncate, db: db, table: t}}
		}
	case "ALTER":
		p.skip("ONLINE")
		p.skip("IGNORE")
		if p.word() != "TABLE" {
			return nil
		}
		p.skip("IF", "EXISTS")
		db, t, ok := p.name()
		if !ok {
			return nil
		}
		tg := ddlTarget{kind: canonical.DDLAlter, db: db, table: t}
		if ndb, nt, ok := p.alterRename(); ok {
			tg = ddlTarget{kind: canonical.DDLRename, db: ndb, table: nt, oldDB: db, oldTable: t}
		}
		return []ddlTarget{tg}
	case "RENAME":
		if p.word() != "TABLE" {
			return nil
		}
		var out []ddlTarget
		for {
			odb, ot, ok := p.name()
			if !ok || p.word() != "TO" {
				return out
			}
			db, t, ok := p.name()
			if !ok {
				return out
			}
			out = append(out, ddlTarget{kind: canonical.DDLRename, db: db, table: t, oldDB: odb, oldTable: ot})
			if !p.punct(",") {
				return out
			}
		}
	}
	return nil
}

type ddlParser struct {
	toks      []ddlToken
	i         int
	defaultDB string
}

// word returns the next token upper-cased if it is an unquoted word, and
// moves past it; "" (not moving) otherwise.
func (p *ddlParser) word() string {
	if p.i < len(p.toks) && !p.toks[p.i].quoted && isIdent(p.toks[p.i].s) {
		p.i++
		return strings.ToUpper(p.toks[p.i-1].s)
	}
	return ""
}

// skip moves past words when all of them come next.
func (p *ddlParser) skip(words ...string) {
	for k, w := range words {
		t := p.i + k
		if t >= len(p.toks) || p.toks[t].quoted || !strings.EqualFold(p.toks[t].s, w) {
			return
		}
	}
	p.i += len(words)
}

func (p *ddlParser) punct(s string) bool {
	if p.i < len(p.toks) && !p.toks[p.i].quoted && p.toks[p.i].s == s {
		p.i++
		return true
	}
	return false
}

// name reads [db.]name.
func (p *ddlParser) name() (db, name string, ok bool) {
	if p.i >= len(p.toks) {
		return "", "", false
	}
	t := p.toks[p.i]
	if !t.quoted && !isIdent(t.s) {
		return "", "", false
	}
	p.i++
	if p.punct(".") {
		if p.i >= len(p.toks) {
			return "", "", false
		}
		n := p.toks[p.i]
		p.i++
		return t.s, n.s, true
	}
	return p.defaultDB, t.s, true
}

// indexTarget reads "[IF [NOT] EXISTS] index ON table" of CREATE/DROP
// INDEX: an ALTER of the table.
func (p *ddlParser) indexTarget() []ddlTarget {
	p.skip("IF", "NOT", "EXISTS")
	p.skip("IF", "EXISTS")
	if p.i >= len(p.toks) {
		return nil
	}
	p.i++ // the index name
	if p.word() != "ON" {
		return nil
	}
	if db, t, ok := p.name(); ok {
		return []ddlTarget{{kind: canonical.DDLAlter, db: db, table: t}}
	}
	return nil
}

// alterRename finds an ALTER TABLE's table rename among its clauses:
// RENAME [TO|AS] name at the top level (not RENAME COLUMN/INDEX/KEY).
func (p *ddlParser) alterRename() (db, name string, ok bool) {
	depth := 0
	for p.i < len(p.toks) {
		t := p.toks[p.i]
		switch {
		case t.quoted:
		case t.s == "(":
			depth++
		case t.s == ")":
			depth--
		case depth == 0 && strings.EqualFold(t.s, "RENAME"):
			p.i++
			switch p.word() {
			case "COLUMN", "INDEX", "KEY":
				continue
			case "TO", "AS", "":
			default:
				p.i-- // the word was the new name
			}
			return p.name()
		}
		p.i++
	}
	return "", "", false
}

// ddlRecords emits a schema-change record (canonical.OpDDL) per captured
// table the statement changes (Config.DDLRecords), before the statement's
// Commit, so they sit in the stream between the rows before and after it.
// The column list after it is information_schema's when the statement is
// read: exact for a reader that is caught up; one that lags behind a later
// DDL of the same table gets that later definition (docs/ARCHITECTURE.md,
// "Schema-change records"). The list before is the one the cache last saw.
func (r *reader) ddlRecords(ctx context.Context, q []byte, defaultDB string, hdr, outer *replication.EventHeader) error {
	targets := r.s.schema.databaseTables(ddlTargets(string(q), defaultDB))
	if len(targets) == 0 {
		return nil
	}
	pos := outer.LogPos - outer.EventSize
	if outer.LogPos < outer.EventSize {
		pos = outer.LogPos
	}
	id := r.tx.gtid
	if id == "" {
		id = r.file + ":" + strconv.FormatUint(uint64(pos), 10)
	}
	for n, tg := range targets {
		captured := r.s.filter.match(tg.db, tg.table)
		if tg.kind == canonical.DDLRename && !captured && !r.s.filter.match(tg.oldDB, tg.oldTable) {
			continue
		}
		if !captured && tg.kind != canonical.DDLRename {
			continue
		}
		// cdcout's own databases (another installation's state, this
		// one's watermarks) are never a subscriber's schema.
		if slices.Contains(r.s.cfg.OwnMarkedDBs, tg.db) {
			continue
		}
		if marked, err := r.s.foreignMarked(ctx, tg.db); err != nil {
			return err
		} else if marked {
			continue
		}
		d := &canonical.DDL{Kind: tg.kind, Statement: string(q), DB: tg.db, Table: tg.table, OldDB: tg.oldDB, OldTable: tg.oldTable}
		cols, err := r.s.schema.ddlColumns(ctx, tg)
		if err != nil {
			return fmt.Errorf("read the columns of %s.%s after %s at %s:%d: %w", tg.db, tg.table, tg.kind, r.file, pos, err)
		}
		d.Columns, d.ColumnsBefore = cols.after, cols.before
		ch := &canonical.Change{
			Op:  canonical.OpDDL,
			Key: canonical.DDLKey(tg.db, tg.table),
			Source: canonical.Source{Connector: "cdcout", Version: r.s.cfg.Version, Instance: r.s.cfg.Instance,
				DB: tg.db, Table: tg.table, ServerID: hdr.ServerID, GTID: r.tx.gtid, File: r.file, Pos: pos,
				Row: r.tx.ordinal, TsMs: int64(hdr.Timestamp) * 1000},
			TsMs:      time.Now().UnixMilli(),
			ChangeKey: "s:" + id + ":" + strconv.Itoa(n),
			DDL:       d,
		}
		// Counted as emitted, so the statement's Commit is not coalesced
		// away: the record must be written with its own checkpoint, not
		// held open into the next transaction, whose replay after a
		// reconnect would drop it.
		r.tx.emitted++
		if err := r.h(ctx, Event{Change: ch}); err != nil {
			return &handlerError{err}
		}
	}
	return nil
}

// ddlCols are a schema change's column lists.
type ddlCols struct{ before, after []canonical.DDLColumn }

// ddlColumns returns the column lists of a schema change and remembers
// the list after it as the table's, for the next change's list before.
func (c *schemaCache) ddlColumns(ctx context.Context, tg ddlTarget) (ddlCols, error) {
	old := tg.db + "." + tg.table
	if tg.kind == canonical.DDLRename {
		old = tg.oldDB + "." + tg.oldTable
	}
	out := ddlCols{before: c.cols[old]}
	if m := c.mapped[old]; m != nil && !describes(out.before, m) {
		// The list came from information_schema after the statement had
		// run (a reader behind it): the binlog's own table map since the
		// last DDL says otherwise, so the list before is not known.
		out.before = nil
	}
	delete(c.mapped, old)
	odb, otable := tg.db, tg.table
	if tg.kind == canonical.DDLRename {
		odb, otable = tg.oldDB, tg.oldTable
	}
	if tg.kind == canonical.DDLDrop {
		c.setCols(odb, otable, nil)
		return out, nil
	}
	after, err := c.columnsNow(ctx, tg.db, tg.table)
	if err != nil {
		return out, err
	}
	out.after = after
	c.setCols(odb, otable, nil)
	if after == nil {
		// Gone by the time the statement is read (a reader behind a later
		// DROP): the binlog says the table exists here all the same.
		c.know(tg.db, tg.table)
		return out, nil
	}
	c.setCols(tg.db, tg.table, after)
	c.ddlAfter[tg.db+"."+tg.table] = ddlAfter{list: after, statement: tg.kind}
	return out, nil
}

// setCols remembers a table's column list (cols), or forgets the table
// (nil), as known (know) too.
func (c *schemaCache) setCols(db, table string, cols []canonical.DDLColumn) {
	if cols == nil {
		delete(c.cols, db+"."+table)
		delete(c.known[db], table)
		return
	}
	c.cols[db+"."+table] = cols
	c.know(db, table)
}

// know notes a table of db that the stream decoded or read a schema change
// of (a DROP DATABASE's tables).
func (c *schemaCache) know(db, table string) {
	if c.known[db] == nil {
		c.known[db] = map[string]bool{}
	}
	c.known[db][table] = true
}

// databaseTables replaces a DROP DATABASE target by a DROP of each table
// of the database the stream knows, in name order: the tables it decoded
// a row of or read a schema change of since it started. There is no
// schema history to list the others (a captured table quiet since the
// stream started gets no record; docs/formats.md).
func (c *schemaCache) databaseTables(targets []ddlTarget) []ddlTarget {
	if !slices.ContainsFunc(targets, func(tg ddlTarget) bool { return tg.kind == ddlDropDatabase }) {
		return targets
	}
	var out []ddlTarget
	for _, tg := range targets {
		if tg.kind != ddlDropDatabase {
			out = append(out, tg)
			continue
		}
		for _, t := range slices.Sorted(maps.Keys(c.known[tg.db])) {
			out = append(out, ddlTarget{kind: canonical.DDLDrop, db: tg.db, table: t})
		}
	}
	return out
}

// ddlSettleTimeout bounds how long columnsNow waits for the statement's
// metadata lock.
const ddlSettleTimeout = 10 * time.Second

// columnsNow reads a table's columns from information_schema; nil when
// the table does not exist (any more).
//
// The server sends a statement's binlog event once it is written, which
// can be before the statement has committed its new definition (seen on
// MySQL 8: an information_schema read right after a DROP COLUMN event
// still listed the column). The statement holds an exclusive metadata
// lock on the table until it is done, so a SELECT … LIMIT 0 of the table
// first waits for it; its error (no such table, no SELECT grant) only
// means there is nothing to wait for, or no way to.
func (c *schemaCache) columnsNow(ctx context.Context, db, table string) ([]canonical.DDLColumn, error) {
	wctx, cancel := context.WithTimeout(ctx, ddlSettleTimeout)
	rows, err := c.db.QueryContext(wctx, "SELECT 1 FROM "+quoteName(db)+"."+quoteName(table)+" LIMIT 0")
	if err == nil {
		rows.Close()
	} else if wctx.Err() != nil && ctx.Err() == nil {
		c.log.Warn("the table stayed locked after its DDL; its column list is read anyway",
			zap.String("table", db+"."+table), zap.Duration("waited", ddlSettleTimeout))
	}
	cancel()
	rows, err = c.db.QueryContext(ctx, `SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, db, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []canonical.DDLColumn
	for rows.Next() {
		var col canonical.DDLColumn
		var nullable string
		if err := rows.Scan(&col.Name, &col.Type, &nullable, &col.Key); err != nil {
			return nil, err
		}
		col.Nullable = nullable == "YES"
		out = append(out, col)
	}
	return out, rows.Err()
}

// describes reports whether cols (information_schema's) describe the
// table t was decoded as: the same columns, names, types and nullability
// in the same order.
func describes(cols []canonical.DDLColumn, t *Table) bool {
	if len(cols) != len(t.Columns) {
		return false
	}
	for i, c := range cols {
		tc := &t.Columns[i]
		if !strings.EqualFold(c.Name, tc.Name) || c.Nullable != tc.Nullable || !compatible(c.DataType(), tc.Type) {
			return false
		}
	}
	return true
}

// ddlAfter is a schema-change record's list after, kept until the
// table's next table map can check it (checkDDLAfter).
type ddlAfter struct {
	list      []canonical.DDLColumn
	statement string
}

// checkDDLAfter compares the last schema-change record's list after of
// t's table with the binary log's own table map that follows it. They
// differ when information_schema had already moved on to a later DDL when
// the statement was read (a reader behind it): the record went out with
// that later list, which is logged, since it cannot be taken back.
func (c *schemaCache) checkDDLAfter(t *Table) {
	name := t.DB + "." + t.Name
	a, ok := c.ddlAfter[name]
	if !ok {
		return
	}
	delete(c.ddlAfter, name)
	if !describes(a.list, t) {
		names := make([]string, len(t.Columns))
		for i := range t.Columns {
			names[i] = t.Columns[i].Name
		}
		c.log.Warn("the column list of a schema-change record was information_schema's after a later DDL of the table "+
			"(cdcout read the statement late); the binary log's rows after it have other columns",
			zap.String("table", name), zap.String("kind", a.statement), zap.Strings("columns_in_binlog", names))
	}
}

// quoteName is a backquoted identifier.
func quoteName(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
