// Package canonical defines cdcout's change record and its canonical JSON:
// object keys sorted at every depth, no insignificant whitespace, and one
// lossless representation per MySQL type, so the same row change produces the
// same bytes, and the same digest, on every replica.
package canonical

// Op is the kind of a change, as in Debezium's envelope.
type Op string

// The change kinds.
const (
	OpCreate Op = "c" // INSERT
	OpUpdate Op = "u" // UPDATE
	OpDelete Op = "d" // DELETE
	OpRead   Op = "r" // a row read by a backfill (snapshot)
)

// Row is one row image: column name → canonical value.
//
// Canonical values are the Go types the encoder accepts (see Marshal): nil,
// bool, int64, uint64, float32, float64, string, json.Number, RawJSON, []byte
// (encoded as base64), Row / map[string]any and []any.
type Row map[string]any

// RawJSON is a JSON document taken from a JSON column. The encoder parses it
// and re-emits it canonically (sorted keys, no whitespace, numbers kept as
// written), so it is embedded as JSON rather than as an escaped string.
type RawJSON []byte

// Source says where a change came from. Field names follow Debezium's
// source block where one exists.
type Source struct {
	Connector string `json:"connector"` // always "cdcout"
	Version   string `json:"version"`   // cdcout's version
	Instance  string `json:"instance"`  // the --instance namespace
	DB        string `json:"db"`
	Table     string `json:"table"`
	ServerID  uint32 `json:"server_id"` // server_id of the event's origin
	GTID      string `json:"gtid"`      // the transaction's GTID, "" without GTIDs
	File      string `json:"file"`      // binlog file of the rows event
	Pos       uint32 `json:"pos"`       // binlog position of the rows event
	Row       int    `json:"row"`       // ordinal of this row image in its transaction, from 0
	TsMs      int64  `json:"ts_ms"`     // commit time on the source (event header), ms
	// Tx places the change in its transaction, for sinks with
	// transactions: true (nil otherwise; txmeta.go).
	Tx *TxOrder `json:"tx,omitempty"`
}

// Change is one row change.
type Change struct {
	Op     Op
	Before Row // nil for inserts and reads
	After  Row // nil for deletes
	// Key holds the primary key columns (or the first NOT NULL unique
	// key's). Nil when the table has neither: the change is still emitted,
	// with "key": null.
	Key Row
	// KeyCols, when Key is nil, name the key columns (sorted), whose values
	// are in After (Before for a delete): the binlog stream sets them rather
	// than build a second map per change. Read the key with KeyRow, or let
	// the encoders (KeyJSONOf, DigestChange, envelopes) read either form.
	KeyCols []string
	Source  Source
	// TsMs is when cdcout decoded the change, ms since the epoch.
	TsMs int64
	// ChangeKey is the change's durable identity (docs/ARCHITECTURE.md, "Change identity"): in GTID mode
	// "g:<gtid>:<ordinal>", in digest mode "d:<digest>:<occurrence>", for a
	// backfill "b:<backfill id>:<key digest>".
	ChangeKey string
	// Tx is set on a transaction record (Op OpTransaction) only.
	Tx *TxRecord
	// DDL is set on a schema-change record (Op OpDDL) only.
	DDL *DDL
}

// KeyRow returns the change's key as a Row: Key, or a Row built from
// KeyCols; nil when the change has no key.
func (c *Change) KeyRow() Row {
	if c.Key != nil || len(c.KeyCols) == 0 {
		return c.Key
	}
	img := c.keyImage()
	k := make(Row, len(c.KeyCols))
	for _, n := range c.KeyCols {
		k[n] = img[n]
	}
	return k
}

// keyImage is the image KeyCols refer to.
func (c *Change) keyImage() Row {
	if c.After != nil {
		return c.After
	}
	return c.Before
}

// ImageBytes estimates the memory of c's row images: the bytes of every
// string, binary, JSON and number-as-text value of Before and After, plus
// 8 per other value. It is what max_row_bytes bounds, cheap enough to ask
// of every change (no encoding).
func (c *Change) ImageBytes() int {
	if c == nil {
		return 0
	}
	return valueBytes(c.Before) + valueBytes(c.After)
}

func valueBytes(v any) int {
	switch x := v.(type) {
	case nil:
		return 0
	case int64, uint64, float64, float32, bool:
		// Before the interface case below, which costs a method lookup.
		return 8
	case string:
		return len(x)
	case []byte:
		return len(x)
	case RawJSON:
		return len(x)
	case Row:
		n := 0
		for k, e := range x {
			n += len(k) + valueBytes(e)
		}
		return n
	case map[string]any:
		n := 0
		for k, e := range x {
			n += len(k) + valueBytes(e)
		}
		return n
	case []any:
		n := 0
		for _, e := range x {
			n += valueBytes(e)
		}
		return n
	case interface{ String() string }: // json.Number and the like
		return len(x.String())
	default:
		return 8
	}
}
