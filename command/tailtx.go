package command

import (
	"maps"
	"time"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
)

// tailTx is tail's transaction metadata (--transactions): the records a
// sink with transactions: true stores (engine/txmeta.go), for the one
// reader tail is — a BEGIN before a transaction's first change, source.tx
// on each change, an END with the counts at its commit.
type tailTx struct {
	instance string
	id       string // "" between transactions
	source   canonical.Source
	lastRow  int
	total    int
	tables   map[string]int
}

// place returns ch with its place in the transaction, and the
// transaction's BEGIN when ch is its first change.
func (t *tailTx) place(ch *canonical.Change) (placed, begin *canonical.Change) {
	switch {
	case t.id == "":
		t.id, t.source = canonical.TransactionID(ch.Source), ch.Source
		t.total, t.tables = 0, map[string]int{}
		begin = t.record(&canonical.TxRecord{ID: t.id, Status: canonical.TxBegin}, t.source, ch.TsMs)
	case ch.Source.Row <= t.lastRow:
		// The stream replays a transaction cut off by a reconnect from
		// its first row: count its changes once.
		t.total, t.tables = 0, map[string]int{}
	}
	t.lastRow = ch.Source.Row
	name := ch.Source.DB + "." + ch.Source.Table
	t.total++
	t.tables[name]++
	c := *ch
	c.Source.Tx = &canonical.TxOrder{ID: t.id, TotalOrder: t.total, TableOrder: t.tables[name]}
	return &c, begin
}

// end returns the END of the transaction committed at c, nil when none of
// its changes was printed.
func (t *tailTx) end(c *binlog.Commit) *canonical.Change {
	if t.id == "" {
		return nil
	}
	src := t.source
	src.File, src.Pos, src.TsMs = c.Pos.File, c.Pos.Pos, c.Time.UnixMilli()
	r := &canonical.TxRecord{ID: t.id, Status: canonical.TxEnd, EventCount: t.total, Tables: maps.Clone(t.tables)}
	t.id = ""
	return t.record(r, src, time.Now().UnixMilli())
}

func (t *tailTx) record(r *canonical.TxRecord, src canonical.Source, tsMs int64) *canonical.Change {
	return canonical.NewTransactionRecord(t.instance, r, src, tsMs)
}
