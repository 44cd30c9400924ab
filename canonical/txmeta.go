package canonical

import (
	"slices"
	"strconv"
)

// OpTransaction is the op of a transaction record: the BEGIN or END of a
// source transaction that touched a sink's tables (Debezium's transaction
// metadata), for sinks with transactions: true. Ops are one letter where
// they are stored (the outbox's op column); the envelope spells this one
// TransactionOpName.
const OpTransaction Op = "t"

// TransactionOpName is OpTransaction in the envelope: "op":"tx".
const TransactionOpName = "tx"

// Transaction records are routed as if from this table (a pipe, topic
// and subject of their own).
const TransactionTable = "transaction"

// Transaction record statuses.
const (
	TxBegin = "BEGIN"
	TxEnd   = "END"
)

// TxOrder is a change's place in its transaction, in the envelope's
// source.tx: the transaction's id (its GTID, else file:pos of its first
// change) and the change's 1-based order among the transaction's changes
// the sink receives, and among those of its table.
type TxOrder struct {
	ID         string `json:"id"`
	TotalOrder int    `json:"total_order"`
	TableOrder int    `json:"table_order"`
}

func (t *TxOrder) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst, _ = appendString(dst, t.ID)
	dst = append(dst, `,"table_order":`...)
	dst = strconv.AppendInt(dst, int64(t.TableOrder), 10)
	dst = append(dst, `,"total_order":`...)
	dst = strconv.AppendInt(dst, int64(t.TotalOrder), 10)
	return append(dst, '}')
}

// TxRecord is what a transaction record says (the envelope's "tx"): END
// also counts the transaction's changes the sink receives, in all and per
// table ("db.table").
type TxRecord struct {
	ID     string
	Status string
	// EventCount and Tables are set on END only.
	EventCount int
	Tables     map[string]int
}

func (t *TxRecord) doc() map[string]any {
	d := map[string]any{"id": t.ID, "status": t.Status}
	if t.Status == TxEnd {
		cols := make([]any, 0, len(t.Tables))
		for _, name := range sortedKeys(t.Tables) {
			cols = append(cols, map[string]any{"data_collection": name, "event_count": t.Tables[name]})
		}
		d["event_count"], d["data_collections"] = t.EventCount, cols
	}
	return d
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TransactionID is the id of the transaction whose first change has
// source src: its GTID, else its file:pos.
func TransactionID(src Source) string {
	if src.GTID != "" {
		return src.GTID
	}
	return src.File + ":" + strconv.FormatUint(uint64(src.Pos), 10)
}

// NewTransactionRecord is the transaction record r of instance's stream
// at src (the transaction's first change's for a BEGIN, its commit's for
// an END), routed as table HeartbeatDB.TransactionTable, under the key
// {"instance": …} and the change key "t:<id>:begin|end", the same on
// every replica, replay and reader.
func NewTransactionRecord(instance string, r *TxRecord, src Source, tsMs int64) *Change {
	src.DB, src.Table, src.Row, src.Tx = HeartbeatDB, TransactionTable, 0, nil
	status := "begin"
	if r.Status == TxEnd {
		status = "end"
	}
	return &Change{Op: OpTransaction, Key: Row{"instance": instance}, Source: src, TsMs: tsMs,
		ChangeKey: "t:" + r.ID + ":" + status, Tx: r}
}
