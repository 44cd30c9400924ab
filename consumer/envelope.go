package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Where cdcout's records without a row come from (canonical.HeartbeatDB
// and friends; the package keeps to the standard library).
const (
	cdcoutDB         = "__cdcout"
	heartbeatTable   = "heartbeat"
	transactionTable = "transaction"
)

// Change is one record, whatever format cdcout's sink was configured with.
type Change struct {
	// ID is the delivery id (the outbox record's id, the sink's
	// webhook-id / ce-id): the same on every redelivery. A maxwell body
	// has none; Handler takes it from the webhook-id header. A debezium
	// transaction record carries it as delivery_id (its id is the
	// transaction's).
	ID string
	// Op is "c" (insert), "u" (update), "d" (delete) or "r" (backfill);
	// "ddl" for a schema change, "tx" for a transaction's BEGIN or END,
	// "hb" for a heartbeat (their details are in Body; docs/formats.md).
	// Debezium's form of a TRUNCATE is op "t".
	Op    string
	DB    string
	Table string
	// Key is the row key as canonical JSON (null for a keyless table and
	// for maxwell, which does not carry it).
	Key json.RawMessage
	// Before and After are the row images (null where the op has none).
	// For maxwell, Before holds only the changed columns' old values.
	Before, After json.RawMessage
	// GTID is the source transaction's GTID ("" without GTIDs).
	GTID string
	// TxID is the source transaction's id (its GTID, else file:pos) on a
	// transaction record and on a change of a sink with transactions:
	// true (not on maxwell rows, which carry only xid and xoffset); ""
	// otherwise.
	TxID string
	// CommitTime is the source commit time (zero if unknown).
	CommitTime time.Time
	// Format is "debezium" (the native format too: row changes are the
	// same envelope), "cloudevents" or "maxwell".
	Format string
	// Body is the record as it was sent.
	Body json.RawMessage
}

// debeziumEnvelope is cdcout's canonical envelope (docs/formats.md), and
// a heartbeat in the debezium format (no op).
type debeziumEnvelope struct {
	ID     string          `json:"id"`
	Op     string          `json:"op"`
	Key    json.RawMessage `json:"key"`
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
	Source *struct {
		DB    string `json:"db"`
		Table string `json:"table"`
		GTID  string `json:"gtid"`
		TsMs  int64  `json:"ts_ms"`
		Tx    *txID  `json:"tx"`
	} `json:"source"`
	Tx *txID `json:"tx"` // transaction records
	// Transaction is Debezium's block on a change (debezium format).
	Transaction *txID `json:"transaction"`
	TsMs        int64 `json:"ts_ms"`
}

type txID struct {
	ID string `json:"id"`
}

// debeziumTx is a transaction record in the debezium format: Debezium's
// transaction-topic value plus cdcout's delivery id.
type debeziumTx struct {
	DeliveryID string `json:"delivery_id"`
	ID         string `json:"id"`
	Status     string `json:"status"`
	TsMs       int64  `json:"ts_ms"`
}

type cloudEvent struct {
	SpecVersion string           `json:"specversion"`
	ID          string           `json:"id"`
	Data        debeziumEnvelope `json:"data"`
}

type maxwellRow struct {
	Database string          `json:"database"`
	Table    string          `json:"table"`
	Type     string          `json:"type"`
	Ts       int64           `json:"ts"`
	Data     json.RawMessage `json:"data"`
	Old      json.RawMessage `json:"old"`
	GTID     string          `json:"gtid"`
}

var maxwellOps = map[string]string{"insert": "c", "update": "u", "delete": "d", "bootstrap-insert": "r",
	"table-create": "ddl", "table-alter": "ddl", "table-drop": "ddl", "table-truncate": "ddl",
	"transaction": "tx", "heartbeat": "hb"}

// Decode parses a webhook body: one record, or a JSON array of records
// (a sink with http: {batch: true}), in any of the three formats, told
// apart by their fields. An error says what is wrong; a receiver answers
// it with 400, which dead-letters the record at cdcout (no retry can fix
// a body the receiver cannot read).
func Decode(body []byte) ([]Change, error) {
	b := bytes.TrimSpace(body)
	if len(b) > 0 && b[0] == '[' {
		var items []json.RawMessage
		if err := json.Unmarshal(b, &items); err != nil {
			return nil, fmt.Errorf("decode batch: %w", err)
		}
		out := make([]Change, 0, len(items))
		for i, it := range items {
			c, err := DecodeOne(it)
			if err != nil {
				return nil, fmt.Errorf("batch element %d: %w", i, err)
			}
			out = append(out, c)
		}
		return out, nil
	}
	c, err := DecodeOne(b)
	if err != nil {
		return nil, err
	}
	return []Change{c}, nil
}

// DecodeOne parses one record (a Kafka or NATS message body, a stream
// entry's body field, a JSON line of the file sink).
func DecodeOne(body []byte) (Change, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(body, &probe); err != nil {
		return Change{}, fmt.Errorf("decode record: %w", err)
	}
	c := Change{Body: json.RawMessage(body)}
	switch {
	case probe["specversion"] != nil:
		var ce cloudEvent
		if err := json.Unmarshal(body, &ce); err != nil {
			return Change{}, fmt.Errorf("decode cloudevent: %w", err)
		}
		if err := c.fromEnvelope(ce.Data); err != nil {
			return Change{}, fmt.Errorf("cloudevent data: %w", err)
		}
		c.ID, c.Format = ce.ID, "cloudevents"
	case probe["database"] != nil && probe["type"] != nil:
		var m maxwellRow
		if err := json.Unmarshal(body, &m); err != nil {
			return Change{}, fmt.Errorf("decode maxwell row: %w", err)
		}
		op, ok := maxwellOps[m.Type]
		if !ok {
			return Change{}, fmt.Errorf("maxwell row: unknown type %q", m.Type)
		}
		c.Op, c.DB, c.Table, c.GTID, c.Format = op, m.Database, m.Table, m.GTID, "maxwell"
		c.Key, c.Before, c.After = json.RawMessage("null"), orNull(m.Old), m.Data
		if op == "d" {
			c.Before, c.After = m.Data, json.RawMessage("null")
		}
		if m.Ts > 0 {
			c.CommitTime = time.Unix(m.Ts, 0).UTC()
		}
		if op == "tx" {
			var tx txID
			if err := json.Unmarshal(m.Data, &tx); err != nil {
				return Change{}, fmt.Errorf("maxwell transaction record: %w", err)
			}
			c.TxID = tx.ID
		}
	case probe["source"] != nil:
		var e debeziumEnvelope
		if err := json.Unmarshal(body, &e); err != nil {
			return Change{}, fmt.Errorf("decode envelope: %w", err)
		}
		if e.Op == "" && e.Source != nil && e.Source.DB == cdcoutDB && e.Source.Table == heartbeatTable {
			e.Op = "hb" // debezium's form of a heartbeat
		}
		if err := c.fromEnvelope(e); err != nil {
			return Change{}, err
		}
		c.Format = "debezium"
	case probe["status"] != nil && probe["delivery_id"] != nil:
		var tx debeziumTx
		if err := json.Unmarshal(body, &tx); err != nil {
			return Change{}, fmt.Errorf("decode transaction record: %w", err)
		}
		c.ID, c.Op, c.TxID, c.Format = tx.DeliveryID, "tx", tx.ID, "debezium"
		c.DB, c.Table = cdcoutDB, transactionTable
		c.Key, c.Before, c.After = json.RawMessage("null"), json.RawMessage("null"), json.RawMessage("null")
		if tx.TsMs > 0 {
			c.CommitTime = time.UnixMilli(tx.TsMs).UTC()
		}
	default:
		return Change{}, errors.New("record is neither a cdcout envelope (op, source), a debezium transaction record " +
			"(status, delivery_id), a CloudEvent (specversion) nor a maxwell row (database, type)")
	}
	return c, nil
}

func (c *Change) fromEnvelope(e debeziumEnvelope) error {
	if e.Source == nil || e.Op == "" {
		return errors.New("envelope without op or source")
	}
	c.ID, c.Op, c.Key, c.Before, c.After = e.ID, e.Op, orNull(e.Key), orNull(e.Before), orNull(e.After)
	c.DB, c.Table, c.GTID = e.Source.DB, e.Source.Table, e.Source.GTID
	switch {
	case e.Tx != nil:
		c.TxID = e.Tx.ID
	case e.Transaction != nil:
		c.TxID = e.Transaction.ID
	case e.Source.Tx != nil:
		c.TxID = e.Source.Tx.ID
	}
	if e.Source.TsMs > 0 {
		c.CommitTime = time.UnixMilli(e.Source.TsMs).UTC()
	}
	return nil
}

func orNull(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}
