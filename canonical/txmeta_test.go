package canonical

import (
	"bytes"
	"strings"
	"testing"
)

// TestEnvelopeSourceTx: a change of a sink with transactions: true
// carries source.tx in sorted position, and the envelope stays canonical.
func TestEnvelopeSourceTx(t *testing.T) {
	c := &Change{Op: OpCreate, After: Row{"id": int64(1)}, Key: Row{"id": int64(1)}, ChangeKey: "g:0-1-43:1",
		Source: Source{Connector: "cdcout", DB: "shop", Table: "items", GTID: "0-1-43", Row: 1,
			Tx: &TxOrder{ID: "0-1-43", TotalOrder: 2, TableOrder: 1}}}
	b, err := MarshalEnvelope(c, "x")
	if err != nil {
		t.Fatal(err)
	}
	if want := `"ts_ms":0,"tx":{"id":"0-1-43","table_order":1,"total_order":2},"version":""}`; !strings.Contains(string(b), want) {
		t.Fatalf("envelope %s lacks %s", b, want)
	}
	canon, err := Marshal(RawJSON(b))
	if err != nil || !bytes.Equal(canon, b) {
		t.Fatalf("envelope is not canonical JSON (%v):\n got %s\nwant %s", err, b, canon)
	}
	if _, err := MarshalEnvelope(&Change{Op: OpTransaction}, "x"); err == nil {
		t.Fatal("a transaction record without its transaction was encoded")
	}
}
