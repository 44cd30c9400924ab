package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// record builds the outbox record a drainer would hand a sink for one of
// the envelopes in testdata.
func record(t *testing.T, name string) outbox.Record {
	t.Helper()
	payload, err := os.ReadFile(filepath.Join("testdata", name+".envelope.json"))
	if err != nil {
		t.Fatal(err)
	}
	payload = bytes.TrimSuffix(payload, []byte("\n"))
	var env struct {
		ID     string       `json:"id"`
		Op     canonical.Op `json:"op"`
		Key    json.RawMessage
		Source struct {
			Instance, DB, Table string
			TsMs                int64 `json:"ts_ms"`
		}
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	switch env.Op { // as stored (one letter)
	case canonical.TransactionOpName:
		env.Op = canonical.OpTransaction
	case canonical.DDLOpName:
		env.Op = canonical.OpDDL
	}
	return outbox.Record{
		ID:         env.ID,
		Pipe:       env.Source.Instance + ":" + env.Source.DB + "." + env.Source.Table + ":kafka",
		Sink:       "kafka",
		DB:         env.Source.DB,
		Table:      env.Source.Table,
		Op:         env.Op,
		Key:        string(env.Key),
		Payload:    payload,
		Attempt:    1,
		CommitTime: time.UnixMilli(env.Source.TsMs),
	}
}

// goldenCases are the envelopes in testdata ("<case>.envelope.json"),
// each encoded by every format to "<case>.<format>.json".
var goldenCases = []string{"insert", "insert-tx", "update", "delete", "read", "heartbeat", "tx-begin", "tx-end",
	"ddl-create", "ddl-alter", "ddl-rename", "ddl-truncate", "ddl-drop"}

func TestGolden(t *testing.T) {
	for _, fname := range Names {
		f, err := New(fname)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range goldenCases {
			t.Run(fname+"/"+c, func(t *testing.T) {
				rec := record(t, c)
				got, err := f.Encode(rec)
				if err != nil {
					t.Fatal(err)
				}
				again, err := f.Encode(rec)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, again) {
					t.Fatalf("not deterministic:\n%s\n%s", got, again)
				}
				if !json.Valid(got) {
					t.Fatalf("invalid JSON: %s", got)
				}
				canon, err := canonical.Marshal(canonical.RawJSON(got))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, canon) {
					t.Fatalf("output is not canonical JSON:\n got %s\nwant %s", got, canon)
				}
				path := filepath.Join("testdata", c+"."+fname+".json")
				if *update {
					if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run go test ./format -update to create it)", err)
				}
				if !bytes.Equal(append(got, '\n'), want) {
					t.Fatalf("%s differs:\n got %s\nwant %s", path, got, want)
				}
			})
		}
	}
}

func TestCloudEventsEmbedsEnvelope(t *testing.T) {
	f, _ := New(CloudEvents)
	rec := record(t, "update")
	b, err := f.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	if got, want := string(ev["data"]), string(rec.Payload); got != want {
		t.Fatalf("data = %s, want the envelope %s", got, want)
	}
	for attr, want := range map[string]string{
		"specversion": `"1.0"`,
		"id":          `"` + rec.ID + `"`,
		"source":      `"cdcout/prod"`,
		"type":        `"cdcout.change.u"`,
		"subject":     `"shop.items"`,
		"time":        `"2025-11-29T12:40:01Z"`,
	} {
		if got := string(ev[attr]); got != want {
			t.Errorf("%s = %s, want %s", attr, got, want)
		}
	}
}

func TestMaxwellOldHoldsOnlyChangedColumns(t *testing.T) {
	f, _ := New(Maxwell)
	b, err := f.Encode(record(t, "update"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Type string
		Xid  uint64
		Old  map[string]json.RawMessage
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if got, want := doc.Type, "update"; got != want {
		t.Fatalf("type = %q, want %q", got, want)
	}
	if got, want := doc.Xid, uint64(43); got != want {
		t.Fatalf("xid = %d, want %d", got, want)
	}
	if got, want := len(doc.Old), 2; got != want {
		t.Fatalf("old has %d columns (%v), want %d: name and price", got, doc.Old, want)
	}
	if got, want := string(doc.Old["price"]), `"9.90"`; got != want {
		t.Fatalf("old.price = %s, want %s", got, want)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := New("avro"); err == nil {
		t.Fatal("New(avro) succeeded, want an unknown-format error")
	}
	rec := record(t, "insert")
	rec.Payload = []byte(`{"op":`)
	for _, name := range []string{CloudEvents, Maxwell} {
		f, _ := New(name)
		if _, err := f.Encode(rec); err == nil {
			t.Fatalf("%s: encoding a truncated envelope succeeded", name)
		}
	}
}

func TestGTIDSeq(t *testing.T) {
	for gtid, want := range map[string]uint64{
		"0-1-42": 42,
		"3E11FA47-71CA-11E1-9E33-C80AA9429562:23": 23,
	} {
		if got, ok := gtidSeq(gtid); !ok || got != want {
			t.Errorf("gtidSeq(%q) = %d, %v; want %d", gtid, got, ok, want)
		}
	}
	if _, ok := gtidSeq("garbage"); ok {
		t.Error("gtidSeq(garbage) ok")
	}
}

// BenchmarkEncode encodes a change without source.tx ("update", the hot
// path: debezium and native send the stored bytes) and one with it
// ("insert-tx", which debezium splices Debezium's transaction block into).
func BenchmarkEncode(b *testing.B) {
	t := &testing.T{}
	for _, c := range []string{"update", "insert-tx"} {
		rec := record(t, c)
		for _, name := range Names {
			f, _ := New(name)
			b.Run(c+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := f.Encode(rec); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestDebeziumSendsStoredEnvelope: a change without source.tx goes out
// as the very bytes stored, not a copy; one whose images hold what looks
// like source.tx (a JSON column {"tx":…,"version":…}) is not fooled.
func TestDebeziumSendsStoredEnvelope(t *testing.T) {
	f, _ := New(Debezium)
	rec := record(t, "update")
	got, err := f.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rec.Payload) || &got[0] != &rec.Payload[0] {
		t.Fatal("the envelope of a change without source.tx was copied or changed")
	}
	rec.Payload = []byte(`{"after":{"doc":{"a":1,"tx":{"id":"x","table_order":1,"total_order":1},"version":"1"}},"before":null,` +
		`"change_key":"k","id":"i","key":null,"op":"c","source":{"connector":"cdcout","db":"d","file":"f","gtid":"","instance":"",` +
		`"pos":4,"row":0,"server_id":1,"table":"t","ts_ms":5,"version":"0.1.0"},"ts_ms":6}`)
	if got, err := f.Encode(rec); err != nil || !bytes.Equal(got, rec.Payload) {
		t.Fatalf("a JSON column shaped like source.tx changed the envelope (%v):\n%s", err, got)
	}
}

func FuzzEncode(f *testing.F) {
	for _, c := range goldenCases {
		b, err := os.ReadFile(filepath.Join("testdata", c+".envelope.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, op := range []canonical.Op{canonical.OpUpdate, canonical.OpTransaction, canonical.OpHeartbeat, canonical.OpDDL} {
			rec := outbox.Record{ID: "x", Pipe: "i:d.t:s", DB: "d", Table: "t", Op: op, Payload: payload}
			for _, name := range []string{Debezium, CloudEvents, Maxwell} {
				fm, _ := New(name)
				out, err := fm.Encode(rec)
				if err != nil {
					continue
				}
				// debezium sends a row change's payload as it is, valid or not.
				if !json.Valid(out) && (name != Debezium || op != canonical.OpUpdate || json.Valid(payload)) {
					t.Fatalf("%s op %s: invalid JSON %q from %q", name, op, out, payload)
				}
			}
		}
	})
}

func TestTemplateColumnsAndKey(t *testing.T) {
	rec := outbox.Record{ID: "i", Pipe: "p:shop.orders:s", DB: "shop", Table: "orders", Op: canonical.OpDelete,
		Key: `{"id":3}`, Payload: []byte(`{"after":null,"before":{"id":3,"region":"e.u","n":null}}`)}
	tm, err := ParseTemplate("o.{db}.{col:region}.{key}.{col:n}")
	if err != nil {
		t.Fatal(err)
	}
	clean := func(s string) string { return strings.ReplaceAll(s, ".", "_") }
	if got, err := tm.Expand(rec, clean); err != nil || got != "o.shop.e_u.3.null" {
		t.Fatalf("expand = %q, %v", got, err)
	}
	if k, err := MessageKey(rec, []string{"region", "id"}); err != nil || k != `{"region":"e.u","id":3}` {
		t.Fatalf("message key = %q, %v", k, err)
	}
	var missing *MissingColumnError
	if _, err := MessageKey(rec, []string{"customer"}); !errors.As(err, &missing) || missing.Column != "customer" {
		t.Fatalf("missing key column: %v", err)
	}
	if _, err := ParseTemplate("x.{colour}"); err == nil || !strings.Contains(err.Error(), "{colour}") {
		t.Fatalf("unknown placeholder: %v", err)
	}
	if _, err := ParseTemplate("x.{db"); err == nil {
		t.Fatal("unclosed brace accepted")
	}
}
