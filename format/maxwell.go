package format

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// maxwellFormat emits Maxwell's row document
// (https://maxwells-daemon.io/dataformat/): database, table, type, ts, data
// and, for updates, old with the previous values of the changed columns
// only.
//
// Maxwell's xid (InnoDB transaction id) and commit (true on a transaction's
// last row) are not in the binlog row events cdcout reads; instead xid is
// the GTID's sequence number, which is just as unique per transaction within
// a GTID domain, and "gtid" and "position" carry the exact origin. commit is
// never emitted: a row cannot tell it is its transaction's last when it is
// written. A change of a sink with transactions: true has Maxwell's
// xoffset, its 0-based place among the transaction's changes the sink gets.
type maxwellFormat struct{}

func (maxwellFormat) ContentType() string { return "application/json" }

// envelope is the part of the canonical envelope Maxwell needs. Column
// values stay raw: they are already canonical JSON, so comparing their
// bytes says exactly whether a column changed.
type envelope struct {
	Op     canonical.Op               `json:"op"`
	Before map[string]json.RawMessage `json:"before"`
	After  map[string]json.RawMessage `json:"after"`
	Source struct {
		DB      string `json:"db"`
		Table   string `json:"table"`
		GTID    string `json:"gtid"`
		GTIDSet string `json:"gtid_set"` // heartbeats
		File    string `json:"file"`
		Pos     uint32 `json:"pos"`
		TsMs    int64  `json:"ts_ms"`
		// Tx is the change's place in its transaction (sinks with
		// transactions: true).
		Tx *canonical.TxOrder `json:"tx"`
	} `json:"source"`
	TsMs int64           `json:"ts_ms"`
	Tx   json.RawMessage `json:"tx"` // transaction records
}

var maxwellTypes = map[canonical.Op]string{
	canonical.OpCreate: "insert",
	canonical.OpUpdate: "update",
	canonical.OpDelete: "delete",
	canonical.OpRead:   "bootstrap-insert", // Maxwell's name for a backfilled row
}

func (maxwellFormat) Encode(rec outbox.Record) ([]byte, error) {
	if rec.Op == canonical.OpDDL {
		return maxwellDDL(rec)
	}
	var env envelope
	if err := json.Unmarshal(rec.Payload, &env); err != nil {
		return nil, fmt.Errorf("encode maxwell %s: parse envelope: %w", rec.ID, err)
	}
	switch env.Op {
	case canonical.OpHeartbeat:
		return maxwellHeartbeat(rec, env)
	case canonical.TransactionOpName:
		return maxwellTransaction(rec, env)
	}
	typ, ok := maxwellTypes[env.Op]
	if !ok {
		return nil, fmt.Errorf("encode maxwell %s: unknown op %q", rec.ID, env.Op)
	}
	doc := map[string]any{
		"database": env.Source.DB,
		"table":    env.Source.Table,
		"type":     typ,
		"ts":       env.Source.TsMs / 1000,
	}
	data := env.After
	if env.Op == canonical.OpDelete {
		data = env.Before
	}
	doc["data"] = rawRow(data)
	if env.Op == canonical.OpUpdate {
		old := map[string]any{}
		for col, prev := range env.Before {
			if next, ok := env.After[col]; !ok || !bytes.Equal(prev, next) {
				old[col] = canonical.RawJSON(prev)
			}
		}
		doc["old"] = old
	}
	if env.Source.GTID != "" {
		doc["gtid"] = env.Source.GTID
		if xid, ok := gtidSeq(env.Source.GTID); ok {
			doc["xid"] = xid
		}
	}
	if env.Source.Tx != nil {
		doc["xoffset"] = env.Source.Tx.TotalOrder - 1
	}
	return marshalMaxwell(rec, env, doc)
}

// rawRow turns a row of raw canonical values into one the canonical
// encoder accepts; a missing row image stays null.
func rawRow(r map[string]json.RawMessage) any {
	if r == nil {
		return nil
	}
	out := make(map[string]any, len(r))
	for col, v := range r {
		out[col] = canonical.RawJSON(v)
	}
	return out
}

// gtidSeq returns the transaction sequence number of a GTID: the last
// ':'-separated part of a MySQL GTID (uuid:seq) or the last '-'-separated
// part of a MariaDB one (domain-server-seq).
func gtidSeq(gtid string) (uint64, bool) {
	i := strings.LastIndexAny(gtid, ":-")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseUint(gtid[i+1:], 10, 64)
	return n, err == nil
}

// maxwellHeartbeat is a heartbeat as Maxwell's consumers see its own:
// Maxwell writes a row to maxwell.heartbeats and reads it back from the
// binlog; cdcout's has type "heartbeat", the position read up to, and in
// data the heartbeat's time and the last source commit (ms).
func maxwellHeartbeat(rec outbox.Record, env envelope) ([]byte, error) {
	doc := map[string]any{
		"database": env.Source.DB,
		"table":    env.Source.Table,
		"type":     "heartbeat",
		"ts":       env.TsMs / 1000,
		"data":     map[string]any{"heartbeat": env.TsMs, "source_ts_ms": env.Source.TsMs},
	}
	if env.Source.GTIDSet != "" {
		doc["gtid_set"] = env.Source.GTIDSet
	}
	return marshalMaxwell(rec, env, doc)
}

// marshalMaxwell adds the binlog position to doc and encodes it.
func marshalMaxwell(rec outbox.Record, env envelope, doc map[string]any) ([]byte, error) {
	if env.Source.File != "" {
		doc["position"] = env.Source.File + ":" + strconv.FormatUint(uint64(env.Source.Pos), 10)
	}
	b, err := marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode maxwell %s: %w", rec.ID, err)
	}
	return b, nil
}

// maxwellTransaction is a transaction's BEGIN or END. Maxwell marks a
// transaction only by "commit": true on its last row; cdcout's
// transaction records (sinks with transactions: true) have type
// "transaction", Maxwell's xid and gtid, and in data the envelope's tx
// (status, id, and on END the counts).
func maxwellTransaction(rec outbox.Record, env envelope) ([]byte, error) {
	doc := map[string]any{
		"database": env.Source.DB,
		"table":    env.Source.Table,
		"type":     "transaction",
		"ts":       env.Source.TsMs / 1000,
		"data":     canonical.RawJSON(env.Tx),
	}
	if env.Source.GTID != "" {
		doc["gtid"] = env.Source.GTID
		if xid, ok := gtidSeq(env.Source.GTID); ok {
			doc["xid"] = xid
		}
	}
	return marshalMaxwell(rec, env, doc)
}
