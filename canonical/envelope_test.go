package canonical

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleChange() *Change {
	return &Change{
		Op:     OpUpdate,
		Before: Row{"id": uint64(18446744073709551615), "name": "caf\u00e9", "price": "1.500", "doc": RawJSON(`{"b":2,"a":[1,2.0]}`), "blob": []byte{0xff, 0xfe}, "f": float32(0.1), "d": 0.1, "n": nil},
		After:  Row{"id": uint64(18446744073709551615), "name": "caf\u00e9 😀", "price": "2.000", "doc": RawJSON(`{"a":null}`), "blob": []byte{}, "f": float32(1e-7), "d": -2.5e300, "n": int64(-1), "tags": []any{"a", "b"}},
		Key:    Row{"id": uint64(18446744073709551615)},
		Source: Source{
			Connector: "cdcout", Version: "v1.2.3", Instance: "prod", DB: "shop", Table: "items",
			ServerID: 4294967295, GTID: "0-1-42", File: "mariadb-bin.000007", Pos: 4294967295, Row: 3, TsMs: 1700000000123,
		},
		TsMs:      1700000000456,
		ChangeKey: "g:0-1-42:3",
	}
}

func TestMarshalEnvelopeGolden(t *testing.T) {
	got, err := MarshalEnvelope(sampleChange(), "0190f1a2-7b3c-7d4e-8f90-a1b2c3d4e5f6")
	if err != nil {
		t.Fatal(err)
	}
	checkCanonical(t, got)
	path := filepath.Join("testdata", "envelope.golden.json")
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != strings.TrimSuffix(string(want), "\n") {
		t.Fatalf("envelope:\n got %s\nwant %s", got, want)
	}

	noID, err := MarshalEnvelope(sampleChange(), "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(noID), `"change_key":"g:0-1-42:3","id"`) {
		t.Fatalf("envelope without id has an id: %s", noID)
	}
	checkCanonical(t, noID)
}

func TestMarshalEnvelopeInsertDeleteNoKey(t *testing.T) {
	c := &Change{Op: OpCreate, After: Row{"a": int64(1)}, Source: Source{Connector: "cdcout"}}
	got, err := MarshalEnvelope(c, "")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"after":{"a":1},"before":null,"change_key":"","key":null,"op":"c","source":{"connector":"cdcout","db":"","file":"","gtid":"","instance":"","pos":0,"row":0,"server_id":0,"table":"","ts_ms":0,"version":""},"ts_ms":0}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestMarshalEnvelopeErrors(t *testing.T) {
	for name, c := range map[string]*Change{
		"nil":        nil,
		"bad op":     {Op: "x"},
		"bad value":  {Op: OpCreate, After: Row{"a": struct{}{}}},
		"bad utf8":   {Op: OpCreate, Source: Source{Table: "\xff"}},
		"bad key":    {Op: OpCreate, Key: Row{"a": RawJSON("{")}},
		"bad before": {Op: OpDelete, Before: Row{"a": json.Number("x")}},
	} {
		if got, err := MarshalEnvelope(c, ""); err == nil {
			t.Errorf("%s: MarshalEnvelope = %s, want error", name, got)
		}
	}
}

func TestUnmarshalEnvelopeRoundTrip(t *testing.T) {
	b, err := MarshalEnvelope(sampleChange(), "id-1")
	if err != nil {
		t.Fatal(err)
	}
	c, id, err := UnmarshalEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	if id != "id-1" {
		t.Fatalf("id = %q", id)
	}
	if got, want := c.Source, sampleChange().Source; got != want {
		t.Fatalf("source = %+v, want %+v", got, want)
	}
	if c.Op != OpUpdate || c.ChangeKey != "g:0-1-42:3" || c.TsMs != 1700000000456 {
		t.Fatalf("change = %+v", c)
	}
	if got, want := c.Key["id"], json.Number("18446744073709551615"); got != want {
		t.Fatalf("key id = %#v, want %#v", got, want)
	}
	again, err := MarshalEnvelope(c, id)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(b) {
		t.Fatalf("round trip changed bytes:\n%s\n%s", b, again)
	}
	// Digests survive the round trip too (sinks may recompute them).
	orig := sampleChange()
	if got, want := Digest("p", c.Op, c.Key, c.After, c.Before), Digest("p", orig.Op, orig.Key, orig.After, orig.Before); got != want {
		t.Fatalf("digest after round trip %s, want %s", got, want)
	}

	ins := &Change{Op: OpCreate, After: Row{"a": int64(1)}}
	b, _ = MarshalEnvelope(ins, "")
	c, id, err = UnmarshalEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	if id != "" || c.Before != nil || c.Key != nil {
		t.Fatalf("insert round trip: id=%q before=%v key=%v", id, c.Before, c.Key)
	}
}

func TestUnmarshalEnvelopeErrors(t *testing.T) {
	for _, in := range []string{
		``, `{`, `[]`, `{"op":"c"}`, `{"op":"z","source":{}}`,
		`{"op":"c","source":{}} {}`, `{"op":"c","source":{"pos":-1}}`,
	} {
		if _, _, err := UnmarshalEnvelope([]byte(in)); err == nil {
			t.Errorf("UnmarshalEnvelope(%q): want error", in)
		}
	}
}

func TestKeyJSON(t *testing.T) {
	if got := KeyJSON(nil); got != "null" {
		t.Fatalf("KeyJSON(nil) = %q", got)
	}
	if got, want := KeyJSON(Row{"b": "x", "a": int64(-1)}), `{"a":-1,"b":"x"}`; got != want {
		t.Fatalf("KeyJSON = %q, want %q", got, want)
	}
	if got := KeyJSON(Row{"a": struct{}{}}); got != "" {
		t.Fatalf("KeyJSON(invalid) = %q, want empty", got)
	}
}

func TestDigest(t *testing.T) {
	key := Row{"id": int64(1)}
	next := Row{"id": int64(1), "v": "b"}
	prev := Row{"id": int64(1), "v": "a"}
	in, err := appendDigestInput(nil, "i:db.t:hook", &Change{Op: OpUpdate, Key: key, After: next, Before: prev}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(in), `{"key":{"id":1},"next":{"id":1,"v":"b"},"op":"u","pipe":"i:db.t:hook","prev":{"id":1,"v":"a"}}`; got != want {
		t.Fatalf("digest input %s, want %s", got, want)
	}
	// printf '%s' '<the input above>' | sha256sum
	const digestGolden = "c91a16079e73f341835456a4ad4796749bc48870b54b0d424b65684dff47dfa8"
	d := Digest("i:db.t:hook", OpUpdate, key, next, prev)
	if len(d) != 64 || strings.Trim(d, "0123456789abcdef") != "" {
		t.Fatalf("digest %q is not hex sha-256", d)
	}
	if d != digestGolden {
		t.Fatalf("digest %s, want %s", d, digestGolden)
	}
	// Map order and value types that encode alike do not matter; any
	// changed field does.
	if Digest("i:db.t:hook", OpUpdate, Row{"id": 1}, Row{"v": "b", "id": uint64(1)}, prev) != d {
		t.Fatal("digest depends on map order or integer Go type")
	}
	for name, other := range map[string]string{
		"pipe": Digest("i:db.t:other", OpUpdate, key, next, prev),
		"op":   Digest("i:db.t:hook", OpDelete, key, next, prev),
		"key":  Digest("i:db.t:hook", OpUpdate, Row{"id": int64(2)}, next, prev),
		"next": Digest("i:db.t:hook", OpUpdate, key, prev, prev),
		"prev": Digest("i:db.t:hook", OpUpdate, key, next, nil),
		"nil":  Digest("i:db.t:hook", OpUpdate, nil, next, prev),
	} {
		if other == d {
			t.Errorf("digest ignores %s", name)
		}
	}
	if got := Digest("p", OpCreate, Row{"a": struct{}{}}, nil, nil); got != "" {
		t.Fatalf("digest of invalid row = %q, want empty", got)
	}
}

func BenchmarkMarshalEnvelope(b *testing.B) {
	c := &Change{
		Op:     OpUpdate,
		Before: Row{"id": uint64(123456789), "name": "some customer name", "email": "someone@example.com", "price": "1234.50", "qty": int64(3), "created": "2024-01-02T03:04:05.123456Z", "flags": []any{"a", "b"}, "blob": []byte("0123456789abcdef"), "ratio": 0.25, "note": nil},
		After:  Row{"id": uint64(123456789), "name": "some customer name", "email": "someone@example.com", "price": "1299.00", "qty": int64(4), "created": "2024-01-02T03:04:05.123456Z", "flags": []any{"a"}, "blob": []byte("0123456789abcdef"), "ratio": 0.5, "note": "changed"},
		Key:    Row{"id": uint64(123456789)},
		Source: Source{Connector: "cdcout", Version: "dev", Instance: "prod", DB: "shop", Table: "orders", ServerID: 1, GTID: "0-1-12345", File: "mariadb-bin.000001", Pos: 123456, Row: 0, TsMs: 1700000000000},
		TsMs:   1700000000001, ChangeKey: "g:0-1-12345:0",
	}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = AppendEnvelope(buf[:0], c, "")
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkMarshalRawJSON(b *testing.B) {
	doc := RawJSON(`{"user":{"name":"x","tags":["a","b","c"],"age":42,"score":1.25},"items":[{"sku":"A1","qty":2},{"sku":"B2","qty":1}],"active":true}`)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = AppendJSON(buf[:0], doc)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// TestKeyColsEqualKey: a change whose key is named by KeyCols (over After,
// or Before for a delete) encodes exactly like one carrying the Key map, in
// the envelope, KeyJSONOf and DigestChange; KeyRow builds the map.
func TestKeyColsEqualKey(t *testing.T) {
	img := Row{"b": "x", "a": int64(7), "c": 1.5}
	for _, op := range []Op{OpCreate, OpDelete} {
		withMap := &Change{Op: op, Key: Row{"a": int64(7), "b": "x"}, ChangeKey: "g:0-1-1:0"}
		withCols := &Change{Op: op, KeyCols: []string{"a", "b"}, ChangeKey: "g:0-1-1:0"}
		if op == OpCreate {
			withMap.After, withCols.After = img, img
		} else {
			withMap.Before, withCols.Before = img, img
		}
		m, err := MarshalEnvelope(withMap, "id")
		if err != nil {
			t.Fatal(err)
		}
		c, err := MarshalEnvelope(withCols, "id")
		if err != nil {
			t.Fatal(err)
		}
		if string(m) != string(c) {
			t.Fatalf("%s: envelopes differ:\n%s\n%s", op, m, c)
		}
		if a, b := KeyJSONOf(withMap), KeyJSONOf(withCols); a != b || a != `{"a":7,"b":"x"}` {
			t.Fatalf("%s: KeyJSONOf %s vs %s", op, a, b)
		}
		if a, b := DigestChange("p", withMap), DigestChange("p", withCols); a != b || a == "" {
			t.Fatalf("%s: DigestChange %s vs %s", op, a, b)
		}
		if a, b := DigestChange("p", withMap), Digest("p", op, withMap.Key, withMap.After, withMap.Before); a != b {
			t.Fatalf("%s: DigestChange %s, Digest %s", op, a, b)
		}
		if got := KeyJSON(withCols.KeyRow()); got != `{"a":7,"b":"x"}` {
			t.Fatalf("%s: KeyRow gives %s", op, got)
		}
	}
	if got := KeyJSONOf(&Change{Op: OpCreate, After: img}); got != "null" {
		t.Fatalf("no key: %s", got)
	}
}
