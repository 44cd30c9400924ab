package canonical

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMarshal(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"nil", nil, `null`},
		{"true", true, `true`},
		{"false", false, `false`},
		{"int", 42, `42`},
		{"int8 min", int8(math.MinInt8), `-128`},
		{"int16", int16(-32768), `-32768`},
		{"int32", int32(math.MinInt32), `-2147483648`},
		{"int64 min", int64(math.MinInt64), `-9223372036854775808`},
		{"int64 max", int64(math.MaxInt64), `9223372036854775807`},
		{"uint8", uint8(255), `255`},
		{"uint16", uint16(65535), `65535`},
		{"uint32", uint32(4294967295), `4294967295`},
		{"uint64 max", uint64(math.MaxUint64), `18446744073709551615`},
		{"uint", uint(7), `7`},
		{"float64 zero", 0.0, `0`},
		{"float64 negative zero", math.Copysign(0, -1), `-0`},
		{"float64 tenth", 0.1, `0.1`},
		{"float64 integral", 3.0, `3`},
		{"float64 big", 1e21, `1e+21`},
		{"float64 below big", 1e20, `100000000000000000000`},
		{"float64 small", 1e-7, `1e-7`},
		{"float64 at small", 1e-6, `0.000001`},
		{"float64 max", math.MaxFloat64, `1.7976931348623157e+308`},
		{"float64 smallest", math.SmallestNonzeroFloat64, `5e-324`},
		{"float32 tenth", float32(0.1), `0.1`},
		{"float32 third", float32(1.0 / 3), `0.33333334`},
		{"float32 max", float32(math.MaxFloat32), `3.4028235e+38`},
		{"float32 small", float32(1e-7), `1e-7`},
		{"string", "héllo", `"héllo"`},
		{"string emoji", "😀", `"😀"`},
		{"string escapes", "\"\\\b\f\n\r\t\x00\x1f\x7f", `"\"\\\b\f\n\r\t\u0000\u001f` + "\x7f" + `"`},
		{"string no html escape", "<a href='x'>&</a>", `"<a href='x'>&</a>"`},
		{"string line separators kept", "\u2028\u2029", "\"\u2028\u2029\""},
		{"json number", json.Number("-1.500e+10"), `-1.500e+10`},
		{"raw json", RawJSON(` { "b" : [1, 2.50, {"z":null,"a":true}], "a": "x" } `), `{"a":"x","b":[1,2.50,{"a":true,"z":null}]}`},
		{"raw json big number", RawJSON(`[18446744073709551615123, 1.000000000000000000001]`), `[18446744073709551615123,1.000000000000000000001]`},
		{"raw json unicode escapes", RawJSON(`{"k":"\u00e9\ud83d\ude00\u003c"}`), `{"k":"é😀<"}`},
		{"raw json duplicate keys keep last", RawJSON(`{"a":1,"a":2}`), `{"a":2}`},
		{"raw json scalar", RawJSON(`"s"`), `"s"`},
		{"bytes", []byte{0xff, 0x00, 0xfe}, `"/wD+"`},
		{"bytes empty", []byte{}, `""`},
		{"bytes nil", []byte(nil), `""`},
		{"row sorted", Row{"b": 1, "a": 2, "B": 3, "é": 4, "aa": 5}, `{"B":3,"a":2,"aa":5,"b":1,"é":4}`},
		{"nil row", Row(nil), `null`},
		{"empty row", Row{}, `{}`},
		{"nested", map[string]any{"z": []any{map[string]any{"y": 1, "x": Row{"d": nil, "c": []string{"s", "t"}}}}, "a": []any{}},
			`{"a":[],"z":[{"x":{"c":["s","t"],"d":null},"y":1}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Marshal(tt.in)
			if err != nil {
				t.Fatalf("Marshal(%#v): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Marshal(%#v) = %s, want %s", tt.in, got, tt.want)
			}
			if !json.Valid(got) {
				t.Fatalf("Marshal(%#v) = %s is not valid JSON", tt.in, got)
			}
		})
	}
}

func TestMarshalFloatRoundTrip(t *testing.T) {
	for _, f := range []float64{0.1, 1.0 / 3, 123456789.123456789, 1e300, -2.5e-300, 9007199254740993} {
		b, err := Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		back, err := strconv.ParseFloat(string(b), 64)
		if err != nil || back != f {
			t.Fatalf("float64 %v -> %s -> %v (%v)", f, b, back, err)
		}
	}
	for _, f := range []float32{0.1, 1.0 / 3, 16777217, 3.4e38, -1.17549435e-38, 1.4e-45} {
		b, err := Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		back, err := strconv.ParseFloat(string(b), 32)
		if err != nil || float32(back) != f {
			t.Fatalf("float32 %v -> %s -> %v (%v)", f, b, back, err)
		}
	}
}

func TestMarshalErrors(t *testing.T) {
	tests := []struct {
		name string
		in   any
	}{
		{"nan", math.NaN()},
		{"inf", math.Inf(1)},
		{"-inf float32", float32(math.Inf(-1))},
		{"invalid utf8", "a\xffb"},
		{"invalid utf8 key", Row{"\xff": 1}},
		{"invalid utf8 nested", []any{Row{"a": "\xc3"}}},
		{"bad number", json.Number("01")},
		{"bad number dot", json.Number("1.")},
		{"bad number empty", json.Number("")},
		{"bad number exp", json.Number("1e")},
		{"bad number nan", json.Number("NaN")},
		{"raw json empty", RawJSON(``)},
		{"raw json invalid", RawJSON(`{"a":}`)},
		{"raw json trailing", RawJSON(`{} {}`)},
		{"raw json trailing garbage", RawJSON(`1 x`)},
		{"raw json bad utf8", RawJSON("\"\xff\"")},
		{"unsupported type", struct{}{}},
		{"unsupported map type", map[string]string{"a": "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("prefix")
			got, err := AppendJSON(dst, tt.in)
			if err == nil {
				t.Fatalf("AppendJSON(%#v) = %s, want error", tt.in, got)
			}
			if string(got) != "prefix" {
				t.Fatalf("AppendJSON on error returned %q, want dst unchanged", got)
			}
		})
	}
}

func TestMarshalDeepNesting(t *testing.T) {
	doc := strings.Repeat("[", 2000) + strings.Repeat("]", 2000)
	if _, err := Marshal(RawJSON(doc)); err == nil {
		t.Fatal("2000-deep document: want error")
	}
	doc = strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100)
	got, err := Marshal(RawJSON(doc))
	if err != nil {
		t.Fatalf("100-deep document: %v", err)
	}
	if string(got) != doc {
		t.Fatalf("100-deep document changed: %s", got)
	}
}

// checkCanonical fails unless b is valid JSON whose object keys are sorted
// (strictly: no duplicates) at every depth and which has no whitespace
// outside strings.
func checkCanonical(t *testing.T, b []byte) {
	t.Helper()
	if err := canonicalErr(b); err != nil {
		t.Fatal(err)
	}
}

func canonicalErr(b []byte) error {
	if !json.Valid(b) {
		return fmt.Errorf("not valid JSON: %q", b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		object  bool
		lastKey *string
		wantKey bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("tokenize %q: %w", b, err)
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				if n := len(stack); n > 0 && stack[n-1].object {
					stack[n-1].wantKey = true
				}
				stack = append(stack, frame{object: true, wantKey: true})
			case '[':
				if n := len(stack); n > 0 && stack[n-1].object {
					stack[n-1].wantKey = true
				}
				stack = append(stack, frame{})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		}
		n := len(stack)
		if n == 0 || !stack[n-1].object {
			continue
		}
		f := &stack[n-1]
		if f.wantKey {
			k := tok.(string)
			if f.lastKey != nil && *f.lastKey >= k {
				return fmt.Errorf("keys not sorted: %q after %q in %s", k, *f.lastKey, b)
			}
			f.lastKey = &k
			f.wantKey = false
		} else {
			f.wantKey = true
		}
	}
	// No insignificant whitespace: compacting must not change a byte.
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return err
	}
	if !bytes.Equal(compact.Bytes(), b) {
		return fmt.Errorf("output has insignificant whitespace: %q", b)
	}
	return nil
}

func TestCheckCanonicalCanFail(t *testing.T) {
	// The fuzz oracle must be able to say no.
	for _, bad := range []string{`{"b":1,"a":2}`, `{"a":{"d":1,"c":2}}`, `[{"a":1,"a":2}]`, `{"a": 1}`, `{"a":1`} {
		if canonicalErr([]byte(bad)) == nil {
			t.Fatalf("canonicalErr accepted %s", bad)
		}
	}
	if err := canonicalErr([]byte(`{"a":[{"b":1,"c":{"d":" x "}}],"b":{}}`)); err != nil {
		t.Fatal(err)
	}
}

func FuzzMarshal(f *testing.F) {
	seeds := []string{
		`{}`, `[]`, `null`, `0`, `-0`, `1.5e300`, `"x"`,
		`{"b":1,"a":[true,false,null,{"y":"z","x":-1.25}]}`,
		`{"k":"\u00e9\ud83d\ude00\u003c\u2028"}`,
		`[18446744073709551615, -9223372036854775808, 1.000000000000000000001, 1E+2]`,
		`{"a":{"a":{"a":{"b":2,"a":1}}}}`,
		`{"a":1,"a":2}`,
		` { "sp" : [ 1 , 2 ] } `,
		`{"":0,"\u0000":1," ":2}`,
	}
	for i, s := range seeds {
		f.Add([]byte(s), "str\x00é\n"+s, float64(i)/3, float32(i)/7, int64(-i), uint64(i)<<60)
	}
	f.Fuzz(func(t *testing.T, doc []byte, s string, f64 float64, f32 float32, i int64, u uint64) {
		// RawJSON: valid input canonicalises, deterministically and
		// idempotently; invalid input is an error, never garbage.
		out, err := Marshal(RawJSON(doc))
		if err != nil {
			if json.Valid(doc) && utf8.Valid(doc) && depth(doc) < maxDepth-10 {
				t.Fatalf("valid document %q rejected: %v", doc, err)
			}
		} else {
			checkCanonical(t, out)
			again, err := Marshal(RawJSON(doc))
			if err != nil || !bytes.Equal(again, out) {
				t.Fatalf("not deterministic: %q then %q (%v)", out, again, err)
			}
			twice, err := Marshal(RawJSON(out))
			if err != nil || !bytes.Equal(twice, out) {
				t.Fatalf("not idempotent: %q then %q (%v)", out, twice, err)
			}
		}

		// A row of every scalar type.
		row := Row{"s": s, "f64": f64, "f32": f32, "i": i, "u": u, "b": []byte(s), "nested": []any{Row{s: i}}}
		out, err = Marshal(row)
		if err != nil {
			if !math.IsNaN(f64) && !math.IsInf(f64, 0) && !math.IsNaN(float64(f32)) && !math.IsInf(float64(f32), 0) && isUTF8(s) {
				t.Fatalf("row rejected: %v", err)
			}
			return
		}
		checkCanonical(t, out)
		var back map[string]any
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.UseNumber()
		if err := dec.Decode(&back); err != nil {
			t.Fatal(err)
		}
		if back["s"] != s || back["nested"].([]any)[0].(map[string]any)[s] != json.Number(strconv.FormatInt(i, 10)) {
			t.Fatalf("string %q came back as %v", s, back)
		}
		if got, _ := strconv.ParseFloat(string(back["f64"].(json.Number)), 64); got != f64 {
			t.Fatalf("float64 %v came back as %v", f64, got)
		}
		if got, _ := strconv.ParseFloat(string(back["f32"].(json.Number)), 32); float32(got) != f32 {
			t.Fatalf("float32 %v came back as %v", f32, got)
		}
		if got := string(back["i"].(json.Number)); got != strconv.FormatInt(i, 10) {
			t.Fatalf("int64 %v came back as %v", i, got)
		}
		if got := string(back["u"].(json.Number)); got != strconv.FormatUint(u, 10) {
			t.Fatalf("uint64 %v came back as %v", u, got)
		}
		again, _ := Marshal(row)
		if !bytes.Equal(again, out) {
			t.Fatalf("row not deterministic: %q then %q", out, again)
		}
	})
}

func isUTF8(s string) bool { return utf8.ValidString(s) }

// depth is the bracket nesting of a JSON document (ignoring strings well
// enough for the fuzz oracle).
func depth(doc []byte) int {
	d, m, inStr, esc := 0, 0, false, false
	for _, c := range doc {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case !inStr && (c == '[' || c == '{'):
			d++
			m = max(m, d)
		case !inStr && (c == ']' || c == '}'):
			d--
		}
	}
	return m
}

func BenchmarkAppendString(b *testing.B) {
	strs := []string{"name-123456", "2024-05-06T07:08:09.123", strings.Repeat("x", 40), "héllo wörld, ça va?", "1234.56"}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		for _, s := range strs {
			var err error
			if buf, err = appendString(buf[:0], s); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestObjectKeyOrders encodes objects whose key sets repeat, overlap, share
// a size or outnumber the remembered orders, in turn, and checks each
// against the object encoded key by key: a remembered order must never be
// used for another key set.
func TestObjectKeyOrders(t *testing.T) {
	sets := [][]string{
		{"id"}, {"a", "b"}, {"a", "c"}, {"b", "c"}, {"a", "b", "c"}, {"id", "name"},
		{"é", "\x00", "z"}, {"a"}, {"b"}, {"c"}, {"d", "e"}, {"e", "f"}, {"x", "y", "z"}, {"ab", "a"},
	}
	want := func(m Row) string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			kj, _ := Marshal(k)
			vj, err := Marshal(m[k])
			if err != nil {
				t.Fatal(err)
			}
			b.Write(kj)
			b.WriteByte(':')
			b.Write(vj)
		}
		b.WriteByte('}')
		return b.String()
	}
	for round := range 5 {
		for i := range sets {
			// Visit the sets in a different order each round.
			set := sets[(i*(round+1)+round)%len(sets)]
			m := Row{}
			for j, k := range set {
				m[k] = int64(round*100 + j)
			}
			if round%2 == 1 {
				m[set[0]] = Row{"nested": set[len(set)-1], "a": []any{int64(i)}}
			}
			got, err := Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if w := want(m); string(got) != w {
				t.Fatalf("round %d set %q: got %s, want %s", round, set, got, w)
			}
			env, err := AppendEnvelope(nil, &Change{Op: OpCreate, After: m, Key: Row{set[0]: m[set[0]]}}, "")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(env), `{"after":`+want(m)+`,`) {
				t.Fatalf("round %d set %q: envelope %s", round, set, env)
			}
		}
	}
	// A key that is not UTF-8 is an error every time, not only the first.
	for range 3 {
		if _, err := Marshal(Row{"ok": int64(1), "\xff": int64(2)}); err == nil {
			t.Fatal("invalid key accepted")
		}
	}
}

func TestAppendStringWords(t *testing.T) {
	// Every byte value at every offset of a string long enough for the
	// word-at-a-time scan, against the byte-at-a-time rules.
	for c := range 256 {
		for at := range 17 {
			b := []byte(strings.Repeat("abcdefgh", 3))
			b[at] = byte(c)
			s := string(b)
			got, err := appendString(nil, s)
			if c >= utf8.RuneSelf {
				if err == nil {
					t.Fatalf("byte %#x at %d: invalid UTF-8 accepted", c, at)
				}
				continue
			}
			ref, _ := json.Marshal(s)
			want := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(string(ref))
			if err != nil || string(got) != want {
				t.Fatalf("byte %#x at %d: got %s (%v), want %s", c, at, got, err, want)
			}
		}
	}
}

// TestEncoderLeavesNoReferences: an encoder goes back to the pool holding
// no keys or values of the document it encoded, also after an error deep
// inside it.
func TestEncoderLeavesNoReferences(t *testing.T) {
	e := &encoder{}
	bad := Row{"a": int64(1), "b": Row{"x": "ok", "y": []any{Row{"p": int64(1), "q": struct{}{}}}}}
	for range 2 { // the second time through a remembered key order
		if _, err := e.value(nil, bad); err == nil {
			t.Fatal("unsupported value accepted")
		}
		if _, err := e.value(nil, Row{"a": int64(1), "b": "x"}); err != nil {
			t.Fatal(err)
		}
		if len(e.keys) != 0 || len(e.vals) != 0 {
			t.Fatalf("stacks not popped: %d keys, %d values", len(e.keys), len(e.vals))
		}
		for i, k := range e.keys[:cap(e.keys)] {
			if k != "" {
				t.Fatalf("keys[%d] = %q left behind", i, k)
			}
		}
		for i, v := range e.vals[:cap(e.vals)] {
			if v != nil {
				t.Fatalf("vals[%d] = %v left behind", i, v)
			}
		}
	}
}

func TestImageBytes(t *testing.T) {
	c := &Change{Op: OpUpdate,
		Before: Row{"id": int64(1), "b": []byte("12345")},
		After:  Row{"id": int64(1), "s": "abc", "j": RawJSON(`{"a":1}`), "n": nil, "l": []any{"xy", int64(2)}}}
	// before: "id"+8 + "b"+5; after: "id"+8 + "s"+3 + "j"+7 + "n"+0 + "l"+(2+8)
	if got, want := c.ImageBytes(), (2+8)+(1+5)+(2+8)+(1+3)+(1+7)+1+(1+2+8); got != want {
		t.Fatalf("ImageBytes = %d, want %d", got, want)
	}
	if got := (*Change)(nil).ImageBytes(); got != 0 {
		t.Fatalf("nil ImageBytes = %d", got)
	}
}
