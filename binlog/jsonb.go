package binlog

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// MySQL's binary JSON (the storage and binlog form of a JSON column,
// sql-common/json_binary.h), decoded into the text MySQL itself prints for
// the document (what SELECT CAST(col AS CHAR) returns): numbers keep their
// JSONB type's form — a DOUBLE 1 is 1.0, a DECIMAL keeps its scale
// (0.0010), an opaque DATE is "2024-02-29", a DATETIME
// "2024-02-29 13:14:15.500000" — so the canonical encoder, which keeps
// number text as written, emits what a consumer reading MySQL would see.
// go-mysql's own JSON decoding goes through float64 and Go's formatting
// (18446744073709552000 for MySQL's 1.8446744073709552e19); we decode the
// raw bytes instead (see decodeRowsEvent).

const (
	jsonbSmallObject = 0x00
	jsonbLargeObject = 0x01
	jsonbSmallArray  = 0x02
	jsonbLargeArray  = 0x03
	jsonbLiteral     = 0x04
	jsonbInt16       = 0x05
	jsonbUint16      = 0x06
	jsonbInt32       = 0x07
	jsonbUint32      = 0x08
	jsonbInt64       = 0x09
	jsonbUint64      = 0x0a
	jsonbDouble      = 0x0b
	jsonbString      = 0x0c
	jsonbOpaque      = 0x0f
)

// maxJSONDepth bounds nesting as MySQL does (JSON_DOCUMENT_MAX_DEPTH).
const maxJSONDepth = 100

// jsonNode is a decoded document: *jsonObject, *jsonArray or jsonScalar.
type jsonNode any

type jsonMember struct {
	key string
	val jsonNode
}

type jsonObject struct{ members []jsonMember }

type jsonArray struct{ elems []jsonNode }

// jsonScalar is a scalar's JSON text as MySQL prints it.
type jsonScalar string

var errJSONB = errors.New("corrupt binary JSON")

// decodeJSONB decodes one binary JSON document (type byte, then value).
func decodeJSONB(doc []byte) (jsonNode, error) {
	if len(doc) == 0 {
		return nil, errJSONB
	}
	return jsonbValue(doc[0], doc[1:], 0)
}

// jsonbText is the MySQL text of a binary JSON document, compact.
func jsonbText(doc []byte) ([]byte, error) {
	n, err := decodeJSONB(doc)
	if err != nil {
		return nil, err
	}
	return appendJSONNode(nil, n), nil
}

func jsonbValue(t byte, b []byte, depth int) (jsonNode, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d", errJSONB, maxJSONDepth)
	}
	switch t {
	case jsonbSmallObject, jsonbLargeObject, jsonbSmallArray, jsonbLargeArray:
		return jsonbContainer(b, t == jsonbLargeObject || t == jsonbLargeArray, t <= jsonbLargeObject, depth)
	case jsonbLiteral:
		if len(b) < 1 {
			return nil, errJSONB
		}
		switch b[0] {
		case 0:
			return jsonScalar("null"), nil
		case 1:
			return jsonScalar("true"), nil
		case 2:
			return jsonScalar("false"), nil
		}
		return nil, fmt.Errorf("%w: literal %d", errJSONB, b[0])
	case jsonbInt16, jsonbUint16:
		if len(b) < 2 {
			return nil, errJSONB
		}
		v := binary.LittleEndian.Uint16(b)
		if t == jsonbInt16 {
			return jsonScalar(strconv.FormatInt(int64(int16(v)), 10)), nil
		}
		return jsonScalar(strconv.FormatUint(uint64(v), 10)), nil
	case jsonbInt32, jsonbUint32:
		if len(b) < 4 {
			return nil, errJSONB
		}
		v := binary.LittleEndian.Uint32(b)
		if t == jsonbInt32 {
			return jsonScalar(strconv.FormatInt(int64(int32(v)), 10)), nil
		}
		return jsonScalar(strconv.FormatUint(uint64(v), 10)), nil
	case jsonbInt64, jsonbUint64:
		if len(b) < 8 {
			return nil, errJSONB
		}
		v := binary.LittleEndian.Uint64(b)
		if t == jsonbInt64 {
			return jsonScalar(strconv.FormatInt(int64(v), 10)), nil
		}
		return jsonScalar(strconv.FormatUint(v, 10)), nil
	case jsonbDouble:
		if len(b) < 8 {
			return nil, errJSONB
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64(b))
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: double %v", errJSONB, f)
		}
		return jsonScalar(mysqlDouble(f)), nil
	case jsonbString:
		n, size, err := jsonbVarLen(b)
		if err != nil || len(b) < size+n {
			return nil, errJSONB
		}
		return jsonScalar(quoteJSON(b[size : size+n])), nil
	case jsonbOpaque:
		if len(b) < 1 {
			return nil, errJSONB
		}
		n, size, err := jsonbVarLen(b[1:])
		if err != nil || len(b) < 1+size+n {
			return nil, errJSONB
		}
		return jsonbOpaqueValue(b[0], b[1+size:1+size+n])
	}
	return nil, fmt.Errorf("%w: type 0x%02x", errJSONB, t)
}

func jsonbContainer(b []byte, large, object bool, depth int) (jsonNode, error) {
	os := 2
	if large {
		os = 4
	}
	read := func(p int) (int, bool) {
		if p < 0 || p+os > len(b) {
			return 0, false
		}
		if large {
			return int(binary.LittleEndian.Uint32(b[p:])), true
		}
		return int(binary.LittleEndian.Uint16(b[p:])), true
	}
	count, ok1 := read(0)
	size, ok2 := read(os)
	if !ok1 || !ok2 || size > len(b) {
		return nil, errJSONB
	}
	b = b[:size]
	keyEntries := 2 * os
	valueEntries := keyEntries
	if object {
		valueEntries += count * (os + 2)
	}
	if valueEntries+count*(1+os) > len(b) {
		return nil, errJSONB
	}
	var obj *jsonObject
	var arr *jsonArray
	if object {
		obj = &jsonObject{members: make([]jsonMember, count)}
	} else {
		arr = &jsonArray{elems: make([]jsonNode, count)}
	}
	for i := 0; i < count; i++ {
		e := valueEntries + i*(1+os)
		t := b[e]
		var v jsonNode
		var err error
		if inlined(t, large) {
			v, err = jsonbValue(t, b[e+1:e+1+os], depth+1)
		} else {
			off, _ := read(e + 1)
			if off >= len(b) {
				return nil, errJSONB
			}
			v, err = jsonbValue(t, b[off:], depth+1)
		}
		if err != nil {
			return nil, err
		}
		if !object {
			arr.elems[i] = v
			continue
		}
		k := keyEntries + i*(os+2)
		off, _ := read(k)
		klen := int(binary.LittleEndian.Uint16(b[k+os:]))
		if off+klen > len(b) {
			return nil, errJSONB
		}
		obj.members[i] = jsonMember{key: string(b[off : off+klen]), val: v}
	}
	if object {
		return obj, nil
	}
	return arr, nil
}

// inlined reports whether a value of type t sits in its value entry.
func inlined(t byte, large bool) bool {
	switch t {
	case jsonbLiteral, jsonbInt16, jsonbUint16:
		return true
	case jsonbInt32, jsonbUint32:
		return large
	}
	return false
}

// jsonbVarLen reads a length of 1–5 bytes, 7 bits each, low bits first.
func jsonbVarLen(b []byte) (n, size int, err error) {
	for i := 0; i < 5 && i < len(b); i++ {
		n |= int(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return n, i + 1, nil
		}
	}
	return 0, 0, errJSONB
}

// jsonbOpaqueValue renders a value of another MySQL type held in a
// document: DECIMAL as a number with its scale, temporal types as MySQL
// prints them inside JSON (six fraction digits), anything else as MySQL's
// "base64:typeN:…" string.
func jsonbOpaqueValue(fieldType byte, p []byte) (jsonNode, error) {
	switch fieldType {
	case gomysql.MYSQL_TYPE_NEWDECIMAL:
		if len(p) < 2 {
			return nil, errJSONB
		}
		s, err := decimalText(int(p[0]), int(p[1]), p[2:])
		if err != nil {
			return nil, err
		}
		return jsonScalar(s), nil
	case gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_DATETIME, gomysql.MYSQL_TYPE_TIMESTAMP, gomysql.MYSQL_TYPE_TIME:
		if len(p) < 8 {
			return nil, errJSONB
		}
		return jsonScalar(`"` + packedTimeText(fieldType, int64(binary.LittleEndian.Uint64(p))) + `"`), nil
	}
	return jsonScalar(`"base64:type` + strconv.Itoa(int(fieldType)) + ":" + base64.StdEncoding.EncodeToString(p) + `"`), nil
}

// packedTimeText prints MySQL's packed temporal integer (the
// TIME_to_longlong_*_packed forms) as JSON text prints it.
func packedTimeText(fieldType byte, packed int64) string {
	neg := packed < 0
	if neg {
		packed = -packed
	}
	frac := packed % (1 << 24)
	ipart := packed >> 24
	if fieldType == gomysql.MYSQL_TYPE_TIME {
		hms := ipart
		sign := ""
		if neg {
			sign = "-"
		}
		return fmt.Sprintf("%s%02d:%02d:%02d.%06d", sign, (hms>>12)%(1<<10), (hms>>6)%(1<<6), hms%(1<<6), frac)
	}
	ymd := ipart >> 17
	ym := ymd >> 5
	hms := ipart % (1 << 17)
	date := fmt.Sprintf("%04d-%02d-%02d", ym/13, ym%13, ymd%(1<<5))
	if fieldType == gomysql.MYSQL_TYPE_DATE {
		return date
	}
	return fmt.Sprintf("%s %02d:%02d:%02d.%06d", date, hms>>12, (hms>>6)%(1<<6), hms%(1<<6), frac)
}

var decimalDigitBytes = [10]int{0, 1, 1, 2, 2, 3, 3, 4, 4, 4}

// decimalText prints MySQL's binary DECIMAL(prec, scale) with all its
// scale digits, as MySQL prints a DECIMAL inside JSON.
func decimalText(prec, scale int, b []byte) (string, error) {
	if prec < 1 || scale < 0 || scale > prec {
		return "", fmt.Errorf("%w: decimal(%d,%d)", errJSONB, prec, scale)
	}
	intg := prec - scale
	size := intg/9*4 + decimalDigitBytes[intg%9] + scale/9*4 + decimalDigitBytes[scale%9]
	if len(b) < size {
		return "", errJSONB
	}
	buf := append([]byte(nil), b[:size]...)
	var mask byte
	neg := buf[0]&0x80 == 0
	if neg {
		mask = 0xff
	}
	buf[0] ^= 0x80
	p := 0
	group := func(n int) uint64 {
		var v uint64
		for i := 0; i < n; i++ {
			v = v<<8 | uint64(buf[p]^mask)
			p++
		}
		return v
	}
	var ip strings.Builder
	if n := decimalDigitBytes[intg%9]; n > 0 {
		ip.WriteString(strconv.FormatUint(group(n), 10))
	}
	for i := 0; i < intg/9; i++ {
		fmt.Fprintf(&ip, "%09d", group(4))
	}
	digits := strings.TrimLeft(ip.String(), "0")
	if digits == "" {
		digits = "0"
	}
	var out strings.Builder
	if neg {
		out.WriteByte('-')
	}
	out.WriteString(digits)
	if scale > 0 {
		out.WriteByte('.')
		for i := 0; i < scale/9; i++ {
			fmt.Fprintf(&out, "%09d", group(4))
		}
		if r := scale % 9; r > 0 {
			fmt.Fprintf(&out, "%0*d", r, group(decimalDigitBytes[r]))
		}
	}
	return out.String(), nil
}

// mysqlDouble prints a double as MySQL's JSON text does (my_gcvt's shortest
// round-trip digits): plain notation while the decimal point lies within
// -14..15 digits of the first significant digit, with ".0" added to a
// whole number (1.0, 100.0), else 1e16, 1.5e300, 1e-16 (no "+", no
// exponent padding).
func mysqlDouble(f float64) string {
	s := strconv.FormatFloat(f, 'e', -1, 64)
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	mant, exp, _ := strings.Cut(s, "e")
	e, _ := strconv.Atoi(exp)
	digits := strings.Replace(mant, ".", "", 1)
	decpt := e + 1
	if digits == "0" {
		return sign + "0.0"
	}
	if decpt > 15 || decpt < -14 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		return sign + m + "e" + strconv.Itoa(decpt-1)
	}
	switch {
	case decpt <= 0:
		return sign + "0." + strings.Repeat("0", -decpt) + digits
	case decpt < len(digits):
		return sign + digits[:decpt] + "." + digits[decpt:]
	default:
		return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
	}
}

// quoteJSON quotes a UTF-8 string as JSON text (the canonical encoder
// re-escapes it; invalid UTF-8 is refused there with the column's name).
func quoteJSON(s []byte) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			if c < utf8.RuneSelf {
				b.WriteByte(c)
				i++
				continue
			}
			_, size := utf8.DecodeRune(s[i:])
			b.Write(s[i : i+size])
			i += size
			continue
		}
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			fmt.Fprintf(&b, `\u%04x`, c)
		}
		i++
	}
	b.WriteByte('"')
	return b.String()
}

func appendJSONNode(dst []byte, n jsonNode) []byte {
	switch x := n.(type) {
	case *jsonObject:
		dst = append(dst, '{')
		for i, m := range x.members {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, quoteJSON([]byte(m.key))...)
			dst = append(dst, ':')
			dst = appendJSONNode(dst, m.val)
		}
		return append(dst, '}')
	case *jsonArray:
		dst = append(dst, '[')
		for i, e := range x.elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONNode(dst, e)
		}
		return append(dst, ']')
	case jsonScalar:
		return append(dst, x...)
	}
	return append(dst, "null"...)
}

// Partial JSON updates (binlog_row_value_options=PARTIAL_JSON): the after
// image of a JSON column may hold, instead of the document, the list of
// changes to its before image (sql/json_diff.cc): per change an operation
// byte, a length-prefixed path and, but for a removal, a length-prefixed
// binary JSON value.
const (
	jsonDiffReplace = 0
	jsonDiffInsert  = 1
	jsonDiffRemove  = 2
)

// applyJSONDiffs applies the diff list diffs to the document before
// (binary JSON) and returns the resulting document's text.
func applyJSONDiffs(before, diffs []byte) ([]byte, error) {
	doc, err := decodeJSONB(before)
	if err != nil {
		return nil, fmt.Errorf("before image: %w", err)
	}
	for len(diffs) > 0 {
		op := diffs[0]
		diffs = diffs[1:]
		plen, _, n := gomysql.LengthEncodedInt(diffs)
		if n == 0 || uint64(len(diffs)-n) < plen {
			return nil, errJSONB
		}
		path := string(diffs[n : n+int(plen)])
		diffs = diffs[n+int(plen):]
		var val jsonNode
		if op != jsonDiffRemove {
			vlen, _, n := gomysql.LengthEncodedInt(diffs)
			if n == 0 || uint64(len(diffs)-n) < vlen {
				return nil, errJSONB
			}
			if val, err = decodeJSONB(diffs[n : n+int(vlen)]); err != nil {
				return nil, err
			}
			diffs = diffs[n+int(vlen):]
		}
		if doc, err = applyJSONDiff(doc, op, path, val); err != nil {
			return nil, fmt.Errorf("partial JSON update %d at %s: %w", op, path, err)
		}
	}
	return appendJSONNode(nil, doc), nil
}

// jsonLeg is one step of a path: a member name, or an array index.
type jsonLeg struct {
	key   string
	index int
	isKey bool
}

// parseJSONPath reads the paths MySQL writes in diffs: $, then .name,
// ."quoted name" or [index] legs.
func parseJSONPath(p string) ([]jsonLeg, error) {
	if !strings.HasPrefix(p, "$") {
		return nil, errors.New("path does not start with $")
	}
	p = p[1:]
	var legs []jsonLeg
	for len(p) > 0 {
		switch p[0] {
		case '.':
			p = p[1:]
			if strings.HasPrefix(p, `"`) {
				end := 1
				for end < len(p) && p[end] != '"' {
					if p[end] == '\\' {
						end++
					}
					end++
				}
				if end >= len(p) {
					return nil, errors.New("unterminated quoted member")
				}
				var k string
				if err := json.Unmarshal([]byte(p[:end+1]), &k); err != nil {
					return nil, err
				}
				legs = append(legs, jsonLeg{key: k, isKey: true})
				p = p[end+1:]
				continue
			}
			end := strings.IndexAny(p, ".[")
			if end < 0 {
				end = len(p)
			}
			if end == 0 {
				return nil, errors.New("empty member name")
			}
			legs = append(legs, jsonLeg{key: p[:end], isKey: true})
			p = p[end:]
		case '[':
			end := strings.IndexByte(p, ']')
			if end < 0 {
				return nil, errors.New("unterminated array index")
			}
			i, err := strconv.Atoi(strings.TrimSpace(p[1:end]))
			if err != nil || i < 0 {
				return nil, fmt.Errorf("array index %q", p[1:end])
			}
			legs = append(legs, jsonLeg{index: i})
			p = p[end+1:]
		default:
			return nil, fmt.Errorf("unexpected %q", p)
		}
	}
	return legs, nil
}

func applyJSONDiff(doc jsonNode, op byte, path string, val jsonNode) (jsonNode, error) {
	legs, err := parseJSONPath(path)
	if err != nil {
		return nil, err
	}
	if len(legs) == 0 {
		if op != jsonDiffReplace {
			return nil, errors.New("only a replace can target the whole document")
		}
		return val, nil
	}
	parent := doc
	for _, leg := range legs[:len(legs)-1] {
		if parent = child(parent, leg); parent == nil {
			return nil, errors.New("path does not exist in the before image")
		}
	}
	last := legs[len(legs)-1]
	switch p := parent.(type) {
	case *jsonObject:
		if !last.isKey {
			return nil, errors.New("array index into an object")
		}
		i := memberIndex(p, last.key)
		switch {
		case op == jsonDiffRemove && i >= 0:
			p.members = append(p.members[:i], p.members[i+1:]...)
		case op == jsonDiffReplace && i >= 0:
			p.members[i].val = val
		case op == jsonDiffInsert && i < 0:
			p.members = append(p.members, jsonMember{key: last.key, val: val})
		default:
			return nil, errors.New("member does not match the operation")
		}
	case *jsonArray:
		if last.isKey {
			return nil, errors.New("member name into an array")
		}
		i := last.index
		switch {
		case op == jsonDiffRemove && i < len(p.elems):
			p.elems = append(p.elems[:i], p.elems[i+1:]...)
		case op == jsonDiffReplace && i < len(p.elems):
			p.elems[i] = val
		case op == jsonDiffInsert:
			i = min(i, len(p.elems))
			p.elems = append(p.elems, nil)
			copy(p.elems[i+1:], p.elems[i:])
			p.elems[i] = val
		default:
			return nil, errors.New("array index out of range")
		}
	default:
		return nil, errors.New("path goes through a scalar")
	}
	return doc, nil
}

func child(n jsonNode, leg jsonLeg) jsonNode {
	switch x := n.(type) {
	case *jsonObject:
		if leg.isKey {
			if i := memberIndex(x, leg.key); i >= 0 {
				return x.members[i].val
			}
		}
	case *jsonArray:
		if !leg.isKey && leg.index < len(x.elems) {
			return x.elems[leg.index]
		}
	}
	return nil
}

func memberIndex(o *jsonObject, key string) int {
	for i, m := range o.members {
		if m.key == key {
			return i
		}
	}
	return -1
}
