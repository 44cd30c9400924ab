package format

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// debeziumFormat sends a row change's stored envelope (already canonical
// JSON with "id" = the deliveryKey) untouched, with Debezium's top-level
// "transaction" block spliced in when it carries source.tx; transaction
// records, heartbeats and schema changes take Debezium's own forms
// (debeziumTx, debeziumHeartbeat, debeziumDDL).
type debeziumFormat struct{}

func (debeziumFormat) Encode(rec outbox.Record) ([]byte, error) {
	switch rec.Op {
	case canonical.OpDDL:
		return debeziumDDL(rec)
	case canonical.OpTransaction:
		return debeziumTx(rec)
	case canonical.OpHeartbeat:
		return debeziumHeartbeat(rec)
	}
	// The hot path: a change without source.tx goes as stored, told by
	// reading back a few bytes from the envelope's end, never parsing it.
	tx, at := sourceTx(rec.Payload)
	if tx == nil {
		return rec.Payload, nil
	}
	return withTransaction(rec.ID, rec.Payload, tx, at)
}

func (debeziumFormat) ContentType() string { return "application/json" }

// debeziumTx is a transaction record as Debezium writes it to its
// transaction topic: {status, id, ts_ms, event_count, data_collections},
// id the transaction's (its GTID, else file:pos), ts_ms the source time,
// the counts null on BEGIN. Debezium's id is not the delivery id, so the
// delivery id goes as "delivery_id": a consumer that deduplicated on "id"
// would drop a transaction's END as a redelivery of its BEGIN.
func debeziumTx(rec outbox.Record) ([]byte, error) {
	var env struct {
		ID     string `json:"id"`
		Source struct {
			TsMs int64 `json:"ts_ms"`
		} `json:"source"`
		Tx *struct {
			ID              string          `json:"id"`
			Status          string          `json:"status"`
			EventCount      *int            `json:"event_count"`
			DataCollections json.RawMessage `json:"data_collections"`
		} `json:"tx"`
	}
	if err := json.Unmarshal(rec.Payload, &env); err != nil {
		return nil, fmt.Errorf("transaction record %s: parse envelope: %w", rec.ID, err)
	}
	if env.Tx == nil {
		return nil, fmt.Errorf("transaction record %s: no tx object", rec.ID)
	}
	doc := map[string]any{
		"status": env.Tx.Status, "id": env.Tx.ID, "ts_ms": env.Source.TsMs, "delivery_id": env.ID,
		"event_count": nil, "data_collections": nil,
	}
	if env.Tx.EventCount != nil {
		doc["event_count"] = *env.Tx.EventCount
	}
	if len(env.Tx.DataCollections) > 0 {
		doc["data_collections"] = canonical.RawJSON(env.Tx.DataCollections)
	}
	b, err := marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode transaction record %s: %w", rec.ID, err)
	}
	return b, nil
}

// debeziumHeartbeat is a heartbeat in Debezium's form, whose value is
// {"ts_ms": …} (the key, {"serverName": …}, is the message's: cdcout's
// stays {"instance": …} in every format), plus what makes a heartbeat
// useful to measure progress by: the delivery id and the source block
// with the position read up to (file, pos, gtid_set) and the last
// source commit's ts_ms.
func debeziumHeartbeat(rec outbox.Record) ([]byte, error) {
	var env struct {
		ID     string          `json:"id"`
		Source json.RawMessage `json:"source"`
		TsMs   int64           `json:"ts_ms"`
	}
	if err := json.Unmarshal(rec.Payload, &env); err != nil {
		return nil, fmt.Errorf("heartbeat %s: parse envelope: %w", rec.ID, err)
	}
	if len(env.Source) == 0 {
		return nil, fmt.Errorf("heartbeat %s: no source", rec.ID)
	}
	b, err := marshal(map[string]any{"id": env.ID, "source": canonical.RawJSON(env.Source), "ts_ms": env.TsMs})
	if err != nil {
		return nil, fmt.Errorf("encode heartbeat %s: %w", rec.ID, err)
	}
	return b, nil
}

// The tail of a stored change envelope as canonical.MarshalEnvelope writes
// it: …"source":{…,"ts_ms":N[,"tx":{…}],"version":"…"},"ts_ms":N}.
var (
	tailVersion = []byte(`,"version":"`)
	tailTx      = []byte(`,"tx":`)
)

const tailTsMs = `,"ts_ms":`

// withTransaction returns the envelope p of change id with Debezium's
// "transaction": {id, total_order, data_collection_order}, made from its
// source.tx (tx), spliced in before the top-level ts_ms at offset at (its
// sorted place). source.tx stays: cutting it out would cost a copy more
// and say nothing new.
func withTransaction(id string, p, tx []byte, at int) ([]byte, error) {
	var t canonical.TxOrder
	if err := json.Unmarshal(tx, &t); err != nil {
		return nil, fmt.Errorf("change %s: parse source.tx: %w", id, err)
	}
	txID, err := marshal(t.ID)
	if err != nil {
		return nil, fmt.Errorf("change %s: encode transaction id: %w", id, err)
	}
	out := make([]byte, 0, len(p)+len(txID)+80)
	out = append(out, p[:at]...)
	out = append(out, `,"transaction":{"data_collection_order":`...)
	out = strconv.AppendInt(out, int64(t.TableOrder), 10)
	out = append(out, `,"id":`...)
	out = append(out, txID...)
	out = append(out, `,"total_order":`...)
	out = strconv.AppendInt(out, int64(t.TotalOrder), 10)
	out = append(out, '}')
	return append(out, p[at:]...), nil
}

// sourceTx returns the source.tx object of a stored change envelope and
// the offset of its top-level `,"ts_ms":`, or nil when it has none (or is
// not shaped as MarshalEnvelope writes envelopes).
func sourceTx(p []byte) (tx []byte, at int) {
	i := len(p) - 1
	if i < 0 || p[i] != '}' {
		return nil, 0
	}
	for i > 0 && p[i-1]-'0' < 10 {
		i--
	}
	at = i - len(tailTsMs)
	if at < 1 || string(p[at:i]) != tailTsMs || p[at-1] != '}' {
		return nil, 0
	}
	v := versionAt(p[:at-1])
	if v < 1 || p[v-1] != '}' {
		return nil, 0 // source ends with ts_ms: no tx
	}
	t := bytes.LastIndex(p[:v], tailTx)
	if t < 0 {
		return nil, 0
	}
	return p[t+len(tailTx) : v], at
}

// versionAt returns the offset of `,"version":"` in p, which ends with
// the source block's version string, or -1. The version is the
// envelope's last string: scanning back over it to its opening quote
// reads a few bytes, where a search for the member would cost the whole
// hot path's time again (a string holds no unescaped quote, so a version
// with an escaped one takes the search).
func versionAt(p []byte) int {
	i := len(p) - 1
	if i < 0 || p[i] != '"' {
		return -1
	}
	for i--; i >= 0 && p[i] != '"'; i-- {
	}
	if i < 1 || p[i-1] == '\\' {
		return bytes.LastIndex(p, tailVersion)
	}
	v := i + 1 - len(tailVersion)
	if v < 0 || string(p[v:i+1]) != string(tailVersion) {
		return -1
	}
	return v
}
