package engine

import (
	"slices"
	"time"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// txMeta builds the transaction metadata of the transaction being read
// for the sinks with transactions: true — a BEGIN record before its first
// change to a sink, source.tx on each of those changes, an END record with
// the counts at the commit — as open changes of the enqueuer, so they take
// the path of row changes (claims, outbox, checkpoint) and are the same
// records on every replica and every replay.
type txMeta struct {
	id     string           // "" between transactions
	source canonical.Source // the transaction's first change's, for its records
	total  map[string]int   // changes per sink
	tables map[string]map[string]int
}

// place returns ch for sink with its place in the transaction, after
// queuing the transaction's BEGIN for the sink before its first change.
func (q *enqueuer) txPlace(sink string, ch *canonical.Change) *canonical.Change {
	t := &q.tx
	if t.id == "" {
		t.id, t.source = canonical.TransactionID(ch.Source), ch.Source
		t.total, t.tables = map[string]int{}, map[string]map[string]int{}
	}
	if t.total[sink] == 0 {
		q.open = append(q.open, q.txRecord(sink, &canonical.TxRecord{ID: t.id, Status: canonical.TxBegin}, t.source, ch.TsMs))
		t.tables[sink] = map[string]int{}
	}
	name := ch.Source.DB + "." + ch.Source.Table
	t.total[sink]++
	t.tables[sink][name]++
	c := *ch
	c.Source.Tx = &canonical.TxOrder{ID: t.id, TotalOrder: t.total[sink], TableOrder: t.tables[sink][name]}
	return &c
}

// txEnd queues the END records of the transaction committed at c.
func (q *enqueuer) txEnd(c *binlog.Commit) {
	t := &q.tx
	if t.id == "" {
		return
	}
	src := t.source
	src.File, src.Pos, src.TsMs = c.Pos.File, c.Pos.Pos, c.Time.UnixMilli()
	sinks := make([]string, 0, len(t.total))
	for s := range t.total {
		sinks = append(sinks, s)
	}
	slices.Sort(sinks)
	for _, s := range sinks {
		q.open = append(q.open, q.txRecord(s, &canonical.TxRecord{ID: t.id, Status: canonical.TxEnd, EventCount: t.total[s], Tables: t.tables[s]}, src, time.Now().UnixMilli()))
	}
	q.txReset()
}

func (q *enqueuer) txReset() { q.tx = txMeta{} }

// txRecord is a transaction record for sink: BEGINs in a pipe of their
// own (outbox.BeginPipe, "<instance>:__cdcout.transaction_begin:<sink>"),
// ENDs in another (outbox.TransactionPipe,
// "<instance>:__cdcout.transaction:<sink>"), all of an instance's under one
// key, so a sink gets each in commit order; its change key
// "t:<id>:begin|end" is the same on every replica and replay.
func (q *enqueuer) txRecord(sink string, r *canonical.TxRecord, src canonical.Source, tsMs int64) openChange {
	pipe := outbox.BeginPipe(q.instance, sink)
	if r.Status == canonical.TxEnd {
		pipe = outbox.TransactionPipe(q.instance, sink)
	}
	return openChange{pipe: pipe, sink: sink, ch: canonical.NewTransactionRecord(q.instance, r, src, tsMs)}
}
