package binlog

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestMySQLDouble: doubles print as MySQL 9.7 printed them for
// SELECT CAST(JSON_ARRAY(…) AS CHAR) on this machine.
func TestMySQLDouble(t *testing.T) {
	for _, c := range []struct {
		f    float64
		want string
	}{
		{0.1, "0.1"}, {1e-7, "0.0000001"}, {1.5e300, "1.5e300"}, {3, "3.0"},
		{123456789012345678, "1.2345678901234568e17"}, {1e15, "1e15"}, {1e16, "1e16"},
		{0.0001, "0.0001"}, {1.7976931348623157e308, "1.7976931348623157e308"},
		{-2.2250738585072014e-308, "-2.2250738585072014e-308"}, {1e21, "1e21"},
		{12345678901234567890, "1.2345678901234567e19"}, {0.30000000000000004, "0.30000000000000004"},
		{100, "100.0"}, {1.5e-7, "0.00000015"}, {1e-10, "0.0000000001"}, {1e-14, "0.00000000000001"},
		{1e-15, "0.000000000000001"}, {1e-16, "1e-16"}, {1.2345678901234567e-10, "0.00000000012345678901234568"},
		{123456789012345, "123456789012345.0"}, {999999999999999, "999999999999999.0"},
		{1234567890123456, "1.234567890123456e15"}, {-1e16, "-1e16"}, {-0.001, "-0.001"}, {5e-324, "5e-324"},
		{1.2345678901234567e-15, "0.0000000000000012345678901234568"}, {123.456, "123.456"}, {2e-15, "0.000000000000002"},
		{0, "0.0"},
	} {
		if got := mysqlDouble(c.f); got != c.want {
			t.Errorf("mysqlDouble(%v) = %s, want %s", c.f, got, c.want)
		}
	}
}

func TestDecimalText(t *testing.T) {
	// DECIMAL(10,3) 12.345 and -12.345 in MySQL's binary form (7 integer
	// digits in 4 bytes, 3 fraction digits in 2).
	pos := []byte{0x80, 0x00, 0x00, 0x0c, 0x01, 0x59}
	neg := make([]byte, len(pos))
	for i, b := range pos {
		neg[i] = ^b
	}
	for _, c := range []struct {
		prec, scale int
		b           []byte
		want        string
	}{
		{10, 3, pos, "12.345"}, {10, 3, neg, "-12.345"},
		{6, 4, []byte{0x80, 0x00, 0x0a}, "0.0010"},
		{5, 0, []byte{0x7f, 0xff, 0xf8}, "-7"},
	} {
		got, err := decimalText(c.prec, c.scale, c.b)
		if err != nil || got != c.want {
			t.Errorf("decimalText(%d,%d,% x) = %q, %v; want %q", c.prec, c.scale, c.b, got, err, c.want)
		}
	}
	if _, err := decimalText(10, 3, pos[:3]); err == nil {
		t.Error("truncated decimal decoded")
	}
}

// jsonbDoc builds a small binary JSON object of int16 members in key
// order, as MySQL stores them (shorter keys first).
func jsonbDoc(keys []string, vals []int16) []byte {
	n := len(keys)
	head := 4 + n*4 + n*3
	b := make([]byte, head)
	binary.LittleEndian.PutUint16(b[0:], uint16(n))
	off := head
	for i, k := range keys {
		binary.LittleEndian.PutUint16(b[4+i*4:], uint16(off))
		binary.LittleEndian.PutUint16(b[4+i*4+2:], uint16(len(k)))
		off += len(k)
		e := 4 + n*4 + i*3
		b[e] = jsonbInt16
		binary.LittleEndian.PutUint16(b[e+1:], uint16(vals[i]))
	}
	for _, k := range keys {
		b = append(b, k...)
	}
	binary.LittleEndian.PutUint16(b[2:], uint16(len(b)))
	return append([]byte{jsonbSmallObject}, b...)
}

func TestJSONBAndDiffs(t *testing.T) {
	doc := jsonbDoc([]string{"a", "bb"}, []int16{1, -2})
	text, err := jsonbText(doc)
	if err != nil || string(text) != `{"a":1,"bb":-2}` {
		t.Fatalf("jsonbText = %s, %v", text, err)
	}
	dbl := make([]byte, 9)
	dbl[0] = jsonbDouble
	binary.LittleEndian.PutUint64(dbl[1:], math.Float64bits(2))
	diff := func(op byte, path string, val []byte) []byte {
		d := append([]byte{op, byte(len(path))}, path...)
		if op != jsonDiffRemove {
			d = append(append(d, byte(len(val))), val...)
		}
		return d
	}
	var diffs []byte
	diffs = append(diffs, diff(jsonDiffReplace, "$.a", dbl)...)
	diffs = append(diffs, diff(jsonDiffRemove, `$."bb"`, nil)...)
	diffs = append(diffs, diff(jsonDiffInsert, "$.c", []byte{jsonbLiteral, 1})...)
	got, err := applyJSONDiffs(doc, diffs)
	if err != nil || string(got) != `{"a":2.0,"c":true}` {
		t.Fatalf("applyJSONDiffs = %s, %v", got, err)
	}
	for _, bad := range [][]byte{
		diff(jsonDiffReplace, "$.missing", dbl),
		diff(jsonDiffInsert, "$.a", dbl),
		diff(jsonDiffRemove, "$[0]", nil),
		diff(jsonDiffReplace, "$.a.b", dbl),
		diff(jsonDiffReplace, "a", dbl),
		diffs[:len(diffs)-1],
	} {
		if out, err := applyJSONDiffs(doc, bad); err == nil {
			t.Errorf("diff % x applied: %s", bad, out)
		}
	}
}

func TestJSONPathArrays(t *testing.T) {
	arr := &jsonArray{elems: []jsonNode{jsonScalar("1"), jsonScalar("2")}}
	for _, step := range []struct {
		op   byte
		path string
		val  jsonNode
	}{
		{jsonDiffInsert, "$[1]", jsonScalar("9")},
		{jsonDiffInsert, "$[7]", jsonScalar("last")}, // past the end: appended
		{jsonDiffRemove, "$[0]", nil},
		{jsonDiffReplace, "$[0]", jsonScalar(`"x"`)},
	} {
		if _, err := applyJSONDiff(arr, step.op, step.path, step.val); err != nil {
			t.Fatalf("%d %s: %v", step.op, step.path, err)
		}
	}
	if got := string(appendJSONNode(nil, arr)); got != `["x",2,last]` {
		t.Fatalf("array after diffs: %s", got)
	}
}
