package engine

import (
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// ddlPlace returns the schema-change record ch as sink r takes it, and
// its pipe: nil unless the sink has ddl: true and captures the table. A
// RENAME goes to the new name's pipe, or the old name's when the sink
// captures only that one (the record then names the old table in its
// source); the drainer delivers it only after the old name's earlier
// records (outbox: barrier records). The column lists lose the columns
// drop_columns / include_columns keep from the sink.
func (q *enqueuer) ddlPlace(r *route, ch *canonical.Change) (*canonical.Change, string) {
	if !r.ddl || ch.DDL == nil {
		return nil, ""
	}
	d := ch.DDL
	db, table := ch.Source.DB, ch.Source.Table
	if !r.filter.Matches(db, table) {
		if d.OldTable == "" || !r.filter.Matches(d.OldDB, d.OldTable) {
			return nil, ""
		}
		db, table = d.OldDB, d.OldTable
	}
	c := *ch
	c.Source.DB, c.Source.Table = db, table
	t := db + "." + table
	if drop, include := r.tf.drop.in(t), r.tf.include.in(t); drop != nil || include != nil {
		keep := func(cols []canonical.DDLColumn) []canonical.DDLColumn {
			if cols == nil {
				return nil
			}
			out := make([]canonical.DDLColumn, 0, len(cols))
			for _, col := range cols {
				if drop.has(col.Name) || (include != nil && !include.has(col.Name)) {
					continue
				}
				out = append(out, col)
			}
			return out
		}
		dd := *d
		dd.Columns, dd.ColumnsBefore = keep(d.Columns), keep(d.ColumnsBefore)
		c.DDL = &dd
	}
	return &c, outbox.PipeName(q.instance, db, table, r.sink)
}

// handleDDL queues a schema-change record for every sink that takes it.
// Its change key (s:<gtid or file:pos>:<n>) is the same on every replica
// and replay. A transaction the stream replays after a reconnect brings
// its records again: one already open means the replay started, so the
// first reading's open changes go, as for rows (handleChange).
func (q *enqueuer) handleDDL(ch *canonical.Change) error {
	replay := q.lastRow >= 0
	for _, o := range q.open {
		if o.ch.ChangeKey == ch.ChangeKey {
			replay = true
			break
		}
	}
	if replay {
		if q.digestMode && q.midTx {
			return errReread
		}
		clear(q.open)
		q.open = q.open[:0]
		q.txReset()
		q.lastRow = -1
	}
	for _, r := range q.routes {
		if c, pipe := q.ddlPlace(r, ch); c != nil {
			q.open = append(q.open, openChange{pipe: pipe, sink: r.sink, ch: c})
		}
	}
	q.maxBuffered = max(q.maxBuffered, len(q.ready)+len(q.open))
	return nil
}
