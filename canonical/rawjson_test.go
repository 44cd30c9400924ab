package canonical

import (
	"bytes"
	"strings"
	"testing"
)

// referenceRawJSON is what rawJSON replaced: encoding/json into generic
// values (ParseJSON), then the canonical encoder. rawJSON must produce
// its bytes, and fail where it fails.
func referenceRawJSON(raw []byte) ([]byte, error) {
	v, err := ParseJSON(raw)
	if err != nil {
		return nil, err
	}
	return Marshal(v)
}

var rawJSONSeeds = []string{
	`{"b":[1,2.50,{"z":null,"a":true}],"a":"x"}`,
	` { "b" : [ ] , "a" : { } } `,
	`{"a":1,"a":2,"b":{"c":1,"c":[3]},"a":{"x":1}}`,
	`{"k":"\u00e9\ud83d\ude00\u003c\"\\\/\b\f\n\r\t"}`,
	`{"lone":"\ud800x","pair-then-lone":"\ud83d\ude00\udc00","mismatch":"\ud800\u0041","high-high":"\ud800\ud800"}`,
	`["\u0000", "\u001f", "a\u2028b", "<&>"]`,
	`[-0, 0.5e+10, 1E-7, -12.25e3, 18446744073709551615123]`,
	`{"\u0062":1,"a":2,"é":3,"z":4,"\u00e9x":5}`,
	`[true,false,null,"",{},[]]`,
	`{"z":{"y":1,"x":{"b":2,"a":1}},"a":[{"d":1,"c":{"f":0,"e":0}}],"z":{"q":0,"p":{"s":1,"r":2}},"m":"in order"}`,
	`{"a":{"a":1,"b":2},"b":{"d":{"c":1},"c":[3,{"y":0,"x":0}]}}`,
	`{"a":}`, `{"a" 1}`, `{a:1}`, `[1,]`, `[1 2]`, `01`, `1.`, `-`, `1e`, `"\x"`, `"\u12"`, "\"a\x01\"",
	`tru`, `nul`, `{"a":1,}`, `{} {}`, `1 x`, ``, `   `, `"unterminated`, `[`, `{"a":1`,
	"\"\xff\"", `{"nested":` + strings.Repeat("[", 50) + strings.Repeat("]", 50) + `}`,
}

func TestRawJSONMatchesReference(t *testing.T) {
	for _, in := range rawJSONSeeds {
		checkRawJSON(t, []byte(in))
	}
}

func FuzzRawJSON(f *testing.F) {
	for _, in := range rawJSONSeeds {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkRawJSON(t, raw) })
}

func checkRawJSON(t *testing.T, raw []byte) {
	t.Helper()
	want, wantErr := referenceRawJSON(raw)
	e := getEncoder()
	got, gotErr := e.rawJSON([]byte("prefix:"), RawJSON(raw), 1)
	if len(e.members) != 0 {
		t.Fatalf("%q: %d members left on the stack", raw, len(e.members))
	}
	putEncoder(e)
	if valid := ValidJSON(raw); valid != (wantErr == nil) {
		t.Fatalf("%q: ValidJSON %v, reference error %v", raw, valid, wantErr)
	}
	switch {
	case (gotErr == nil) != (wantErr == nil):
		t.Fatalf("%q: error %v, reference error %v", raw, gotErr, wantErr)
	case gotErr != nil:
		if string(got) != "prefix:" {
			t.Fatalf("%q: on error dst became %q", raw, got)
		}
	case !bytes.Equal(got, append([]byte("prefix:"), want...)):
		t.Fatalf("%q:\n got %s\nwant prefix:%s", raw, got, want)
	}
}

// Nesting past maxDepth fails in both, and the encoder is left clean.
func TestRawJSONDepth(t *testing.T) {
	deep := []byte(strings.Repeat(`{"a":`, maxDepth+5) + "1" + strings.Repeat("}", maxDepth+5))
	if _, err := Marshal(RawJSON(deep)); err == nil || !strings.Contains(err.Error(), "nesting too deep") {
		t.Fatalf("deep document: %v, want nesting too deep", err)
	}
	checkRawJSON(t, deep)
}

func BenchmarkRawJSON(b *testing.B) {
	doc := []byte(`{"id":12345,"name":"user-12345","email":"u12345@example.com","address":{"street":"12345 Main Street",` +
		`"city":"Springfield","zip":"12345"},"roles":["reader","writer"],"score":6172.5,"active":false}`)
	b.Run("scanner", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for range b.N {
			var err error
			if buf, err = AppendJSON(buf[:0], RawJSON(doc)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := referenceRawJSON(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
