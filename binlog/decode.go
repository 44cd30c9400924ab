package binlog

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cdcout/cdcout/canonical"
)

// DecodeError says which column of which table could not be decoded, and
// as what type. Decode never turns such a value into null: a silently
// missing value would be delivered as if the row said so.
type DecodeError struct {
	DB, Table string // empty when the caller did not say (Column.Decode alone)
	Column    string
	Type      string // SQL-ish type name, e.g. "DATETIME(3)", "BIGINT UNSIGNED"
	Err       error
}

func (e *DecodeError) Error() string {
	name := e.Column
	if e.Table != "" {
		name = e.DB + "." + e.Table + "." + e.Column
	}
	return fmt.Sprintf("decode column %s (%s): %v", name, e.Type, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// inTable returns err with the database and table filled in when it is a
// *DecodeError, so the message names db.table.column; other errors are
// returned as they are.
func inTable(err error, db, table string) error {
	var de *DecodeError
	if errors.As(err, &de) && de.Table == "" {
		cp := *de
		cp.DB, cp.Table = db, table
		return &cp
	}
	return err
}

// Decode turns the value go-mysql decoded for this column into a canonical
// value (see docs/canonical-json.md for the table of forms).
//
// It expects go-mysql v1.16's output with ParseTime false, UseDecimal false
// and TimestampStringLocation UTC: integers as Go ints (signed unless the
// table map's signedness says otherwise), DECIMAL as a string, temporal
// types as strings, ENUM as an int64 index, SET and BIT as int64 bitmaps,
// strings as Go strings aliasing the event buffer and BLOBs as []byte
// aliasing it. Every string and byte slice returned is a copy: go-mysql's
// values point into a buffer that is reused for the next event.
func (c *Column) Decode(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	out, err := c.decode(v, nil)
	if err != nil {
		return nil, &DecodeError{Column: c.Name, Type: c.TypeName(), Err: err}
	}
	return out, nil
}

// realType resolves the type of a column whose Type was left as
// MYSQL_TYPE_STRING although its metadata says ENUM or SET.
func (c *Column) realType() byte {
	t := c.Type
	if t == gomysql.MYSQL_TYPE_STRING && c.Meta >= 256 {
		if rt := byte(c.Meta >> 8); rt == gomysql.MYSQL_TYPE_ENUM || rt == gomysql.MYSQL_TYPE_SET {
			return rt
		}
	}
	return t
}

// decodeInto is Decode with the value's string, if any, cut from a (which
// may be nil).
func (c *Column) decodeInto(v any, a *rowBytes) (any, error) {
	if v == nil {
		return nil, nil
	}
	out, err := c.decode(v, a)
	if err != nil {
		return nil, &DecodeError{Column: c.Name, Type: c.TypeName(), Err: err}
	}
	return out, nil
}

// rowBytes is the storage one row's strings are cut from: one allocation
// per row instead of one per string. The strings live as long as their row
// does anyway, and a region once handed out is never written again (the
// buffer only grows within its capacity).
type rowBytes struct{ buf []byte }

// size is how many bytes decoding v for c may cut from a rowBytes at
// most: the strings Decode copies from go-mysql's value or builds.
func (c *Column) size(v any) int {
	switch c.realType() {
	case gomysql.MYSQL_TYPE_NEWDECIMAL, gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_NEWDATE:
		if s, ok := v.(string); ok {
			return len(s)
		}
	case gomysql.MYSQL_TYPE_DATETIME, gomysql.MYSQL_TYPE_DATETIME2, gomysql.MYSQL_TYPE_TIMESTAMP,
		gomysql.MYSQL_TYPE_TIMESTAMP2, gomysql.MYSQL_TYPE_TIME, gomysql.MYSQL_TYPE_TIME2:
		return 32 // "YYYY-MM-DDTHH:MM:SS.ffffffZ", "-HHH:MM:SS.ffffff"
	case gomysql.MYSQL_TYPE_BLOB, gomysql.MYSQL_TYPE_TINY_BLOB, gomysql.MYSQL_TYPE_MEDIUM_BLOB,
		gomysql.MYSQL_TYPE_LONG_BLOB, gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING,
		gomysql.MYSQL_TYPE_STRING:
		if c.Geometry || c.JSON || isBinaryCharset(c.Charset) {
			return 0
		}
		switch x := v.(type) {
		case string:
			return len(x)
		case []byte:
			return len(x)
		}
	}
	return 0
}

// str returns a copy of s, cut from a when it fits.
func (a *rowBytes) str(s string) string {
	if a == nil || len(s) == 0 || len(s) > cap(a.buf)-len(a.buf) {
		return strings.Clone(s)
	}
	n := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[n], len(s))
}

// bytes returns b as a string, cut from a when it fits.
func (a *rowBytes) bytes(b []byte) string {
	return a.str(unsafe.String(unsafe.SliceData(b), len(b)))
}

func (c *Column) decode(v any, a *rowBytes) (any, error) {
	switch t := c.realType(); t {
	case gomysql.MYSQL_TYPE_TINY, gomysql.MYSQL_TYPE_SHORT, gomysql.MYSQL_TYPE_INT24,
		gomysql.MYSQL_TYPE_LONG, gomysql.MYSQL_TYPE_LONGLONG:
		return c.decodeInt(v, t)
	case gomysql.MYSQL_TYPE_YEAR:
		n, ok := v.(int)
		if !ok {
			return nil, unexpected(v)
		}
		// YEAR 0000 (the zero year) stays 0, distinguishable from
		// every real year 1901..2155.
		return int64(n), nil
	case gomysql.MYSQL_TYPE_NEWDECIMAL:
		s, ok := v.(string)
		if !ok {
			return nil, unexpected(v)
		}
		if !validDecimal(s) {
			return nil, fmt.Errorf("malformed decimal %q", s)
		}
		return a.str(s), nil
	case gomysql.MYSQL_TYPE_FLOAT:
		f, ok := v.(float32)
		if !ok {
			return nil, unexpected(v)
		}
		return f, nil
	case gomysql.MYSQL_TYPE_DOUBLE:
		f, ok := v.(float64)
		if !ok {
			return nil, unexpected(v)
		}
		return f, nil
	case gomysql.MYSQL_TYPE_BIT:
		n, ok := v.(int64)
		if !ok {
			return nil, unexpected(v)
		}
		// go-mysql packs BIT(64) into an int64; the bits are unsigned.
		return uint64(n), nil
	case gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_NEWDATE:
		return c.decodeDate(v, a)
	case gomysql.MYSQL_TYPE_DATETIME, gomysql.MYSQL_TYPE_DATETIME2:
		return c.decodeDatetime(v, t, false, a)
	case gomysql.MYSQL_TYPE_TIMESTAMP, gomysql.MYSQL_TYPE_TIMESTAMP2:
		return c.decodeDatetime(v, t, true, a)
	case gomysql.MYSQL_TYPE_TIME, gomysql.MYSQL_TYPE_TIME2:
		return c.decodeTime(v, t, a)
	case gomysql.MYSQL_TYPE_ENUM:
		return c.decodeEnum(v)
	case gomysql.MYSQL_TYPE_SET:
		return c.decodeSet(v)
	case gomysql.MYSQL_TYPE_JSON:
		return decodeJSON(v)
	case gomysql.MYSQL_TYPE_GEOMETRY, gomysql.MYSQL_TYPE_VECTOR:
		b, ok := v.([]byte)
		if !ok {
			return nil, unexpected(v)
		}
		return bytes.Clone(b), nil
	case gomysql.MYSQL_TYPE_BLOB, gomysql.MYSQL_TYPE_TINY_BLOB, gomysql.MYSQL_TYPE_MEDIUM_BLOB,
		gomysql.MYSQL_TYPE_LONG_BLOB, gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING,
		gomysql.MYSQL_TYPE_STRING:
		if c.Geometry {
			b, ok := v.([]byte)
			if !ok {
				return nil, unexpected(v)
			}
			return bytes.Clone(b), nil
		}
		// raw may alias go-mysql's buffer; every branch below copies.
		var raw string
		switch x := v.(type) {
		case []byte:
			raw = unsafe.String(unsafe.SliceData(x), len(x))
		case string:
			raw = x
		default:
			return nil, unexpected(v)
		}
		if c.JSON {
			// MariaDB's JSON is LONGTEXT; it is embedded like MySQL's.
			return decodeJSONText(raw)
		}
		if isBinaryCharset(c.Charset) {
			n := len(raw)
			if t == gomysql.MYSQL_TYPE_STRING {
				n = max(n, c.stringLength())
			}
			// BINARY(n): the server strips trailing 0x00 bytes when it
			// writes the row event and pads them back when it reads the
			// column, so SELECT returns n bytes and so must we.
			b := make([]byte, n)
			copy(b, raw)
			return b, nil
		}
		return decodeText(raw, c.Charset, a)
	case gomysql.MYSQL_TYPE_NULL:
		return nil, nil
	default:
		return nil, fmt.Errorf("unsupported binlog column type %d", t)
	}
}

func unexpected(v any) error {
	return fmt.Errorf("unexpected go-mysql value of Go type %T", v)
}

// decodeInt returns int64 for signed and uint64 for unsigned columns.
// go-mysql reads the signedness from the table map when the server writes
// binlog_row_metadata=FULL; otherwise it yields signed values and
// Column.Unsigned (from information_schema) says how to reinterpret them.
func (c *Column) decodeInt(v any, t byte) (any, error) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), nil
	case uint16:
		return uint64(x), nil
	case uint32:
		return uint64(x), nil
	case uint64:
		return x, nil
	case int8:
		if c.Unsigned {
			return uint64(uint8(x)), nil
		}
		return int64(x), nil
	case int16:
		if c.Unsigned {
			return uint64(uint16(x)), nil
		}
		return int64(x), nil
	case int32:
		if c.Unsigned {
			if t == gomysql.MYSQL_TYPE_INT24 {
				return uint64(uint32(x) & 0xFFFFFF), nil
			}
			return uint64(uint32(x)), nil
		}
		return int64(x), nil
	case int64:
		if c.Unsigned {
			return uint64(x), nil
		}
		return x, nil
	}
	return nil, unexpected(v)
}

// decodeDate keeps go-mysql's "YYYY-MM-DD", which is already the ISO form.
// The zero date stays "0000-00-00" (and partial zero dates such as
// "2024-00-00" stay as written): they are not dates, and turning them into
// null would lose the difference from a NULL column.
func (c *Column) decodeDate(v any, a *rowBytes) (any, error) {
	s, ok := v.(string)
	if !ok {
		return nil, unexpected(v)
	}
	if !isDate(s) {
		return nil, fmt.Errorf("malformed date %q", s)
	}
	return a.str(s), nil
}

// decodeDatetime turns go-mysql's "YYYY-MM-DD HH:MM:SS[.frac]" into ISO
// 8601 "YYYY-MM-DDTHH:MM:SS[.frac]" with exactly the column's fractional
// digits; TIMESTAMP (stored as UTC seconds since the epoch, printed by
// go-mysql in UTC) also gets a "Z", making it RFC 3339. Zero values keep
// their all-zero digits ("0000-00-00T00:00:00", "0000-00-00T00:00:00Z"),
// which no parser mistakes for a real instant.
func (c *Column) decodeDatetime(v any, t byte, utc bool, a *rowBytes) (any, error) {
	fsp := c.fsp(t)
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case time.Time:
		// ParseTime=true streams; formatted the same way.
		if utc {
			x = x.UTC()
		}
		s = x.Format("2006-01-02 15:04:05.000000")
	case datetimeText:
		// Formatted by the Stream from the stored bytes (decodeTableMap),
		// with the table map's fraction digits.
		if t != gomysql.MYSQL_TYPE_DATETIME2 || !packedDatetime(t, c.Meta) {
			return nil, unexpected(v)
		}
		return string(x), nil
	default:
		return nil, unexpected(v)
	}
	if len(s) < 19 || !isDate(s[:10]) || s[10] != ' ' || !isClock(s[11:19], 2) {
		return nil, fmt.Errorf("malformed datetime %q", s)
	}
	var buf [40]byte
	b := append(buf[:0], s[:10]...)
	b = append(b, 'T')
	b = append(b, s[11:19]...)
	b, err := appendFraction(b, s[19:], fsp)
	if err != nil {
		return nil, fmt.Errorf("datetime %q: %w", s, err)
	}
	if utc && s[:19] == "0000-00-00 00:00:00" && strings.Trim(string(b[19:]), ".0") != "" {
		// go-mysql prints every TIMESTAMP with 0 epoch seconds as the
		// zero value, but MariaDB stores 1970-01-01 00:00:00.000001 ..
		// 00:00:00.999999 UTC that way too (the zero value has no
		// fraction), and SELECT shows them as real instants.
		copy(b, "1970-01-01T00:00:00")
	}
	if utc {
		b = append(b, 'Z')
	}
	return a.bytes(b), nil
}

// decodeTime keeps MySQL's own TIME form "[-]HH:MM:SS[.frac]": TIME is a
// duration as much as a time of day (-838:59:59..838:59:59), so hours may
// exceed 23 and take three digits. The fraction always has exactly the
// column's digits; go-mysql drops it when it is zero.
func (c *Column) decodeTime(v any, t byte, a *rowBytes) (any, error) {
	s, ok := v.(string)
	if !ok {
		return nil, unexpected(v)
	}
	body := strings.TrimPrefix(s, "-")
	colon := strings.IndexByte(body, ':')
	if colon < 2 || colon > 3 || len(body) < colon+6 || !isClock(body[:colon+6], colon) {
		return nil, fmt.Errorf("malformed time %q", s)
	}
	whole := len(s) - len(body) + colon + 6 // sign and H…:MM:SS
	var buf [24]byte
	b, err := appendFraction(append(buf[:0], s[:whole]...), s[whole:], c.fsp(t))
	if err != nil {
		return nil, fmt.Errorf("time %q: %w", s, err)
	}
	return a.bytes(b), nil
}

// fsp is the fractional-second precision of a temporal column. The table
// map's metadata of the "2" types is the authority (it is what the row was
// written with); the old types have no fraction.
func (c *Column) fsp(t byte) int {
	switch t {
	case gomysql.MYSQL_TYPE_TIME2, gomysql.MYSQL_TYPE_DATETIME2, gomysql.MYSQL_TYPE_TIMESTAMP2:
		if c.Meta <= 6 {
			return int(c.Meta)
		}
	}
	if c.Decimals >= 0 && c.Decimals <= 6 {
		return c.Decimals
	}
	return 0
}

// appendFraction appends ".123" (or "") normalised to exactly fsp digits:
// missing digits are zeros, extra digits must be zeros.
func appendFraction(dst []byte, s string, fsp int) ([]byte, error) {
	if s != "" {
		if s[0] != '.' || len(s) < 2 || len(s) > 7 || !allDigits(s[1:]) {
			return dst, fmt.Errorf("malformed fraction %q", s)
		}
		s = s[1:]
	}
	if len(s) > fsp {
		if strings.Trim(s[fsp:], "0") != "" {
			return dst, fmt.Errorf("fraction %q has more than %d digits", s, fsp)
		}
		s = s[:fsp]
	}
	if fsp == 0 {
		return dst, nil
	}
	dst = append(dst, '.')
	dst = append(dst, s...)
	for i := len(s); i < fsp; i++ {
		dst = append(dst, '0')
	}
	return dst, nil
}

func (c *Column) decodeEnum(v any) (any, error) {
	idx, ok := v.(int64)
	if !ok {
		return nil, unexpected(v)
	}
	if idx == 0 {
		// Index 0 is MySQL's "invalid value" member, the empty string
		// that non-strict modes store for a bad value.
		return "", nil
	}
	if idx < 0 || int(idx) > len(c.EnumValues) {
		return nil, fmt.Errorf("enum index %d outside the %d known members", idx, len(c.EnumValues))
	}
	return c.memberName(c.EnumValues[idx-1])
}

// decodeSet returns the members of a SET value as an array of names in
// definition order (the order MySQL prints them), [] for the empty set.
func (c *Column) decodeSet(v any) (any, error) {
	n, ok := v.(int64)
	if !ok {
		return nil, unexpected(v)
	}
	bits := uint64(n)
	if len(c.SetValues) < 64 && bits>>len(c.SetValues) != 0 {
		return nil, fmt.Errorf("set bitmap %#x names members beyond the %d known", bits, len(c.SetValues))
	}
	out := make([]any, 0, 4)
	for i, name := range c.SetValues {
		if bits&(1<<i) != 0 {
			m, err := c.memberName(name)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// memberName returns an ENUM/SET member name as UTF-8.
//
// The Stream fills EnumValues/SetValues from the table map (binlog
// metadata), which carries the names in the column's character set, or in
// the information_schema fallback from COLUMN_TYPE, which is already UTF-8;
// Column does not say which. A name that is valid UTF-8 is therefore taken
// as it is and anything else is decoded from the column charset. The two
// only collide for a non-UTF-8 name whose bytes happen to form valid UTF-8
// (latin1 "Ã©"), which ENUM member names practically never are; UCS-2/
// UTF-16/UTF-32 names from the table map are recognised by their NUL bytes.
func (c *Column) memberName(name string) (string, error) {
	if utf8.ValidString(name) && (!asciiIncompatible[c.Charset] || !strings.Contains(name, "\x00")) {
		return name, nil
	}
	if isBinaryCharset(c.Charset) {
		return "", fmt.Errorf("member name %q is not UTF-8", name)
	}
	out, err := decodeText(name, c.Charset, nil)
	if err != nil {
		return "", err
	}
	return out.(string), nil
}

// decodeJSON handles MySQL's JSON column: the raw binary JSON
// (decodeJSONRows), the text of a partially updated document, or JSON text
// (a deferred event decoded by go-mysql itself).
func decodeJSON(v any) (any, error) {
	switch x := v.(type) {
	case mysqlJSONB:
		if len(x) == 0 {
			// An empty document is what MySQL stores for a NOT NULL
			// JSON column given an invalid value in non-strict mode;
			// MySQL itself reads it as the JSON null literal.
			return canonical.RawJSON("null"), nil
		}
		text, err := jsonbText(x)
		if err != nil {
			return nil, err
		}
		return canonical.RawJSON(text), nil
	case jsonText:
		return canonical.RawJSON(x), nil
	case string:
		return decodeJSONText(x)
	case []byte:
		if len(x) == 0 {
			// An empty document is what MySQL stores for a NOT NULL
			// JSON column given an invalid value in non-strict mode;
			// MySQL itself reads it as the JSON null literal.
			return canonical.RawJSON("null"), nil
		}
		return decodeJSONText(unsafe.String(unsafe.SliceData(x), len(x)))
	case *replication.JsonDiff:
		// decodeJSONRows applies every diff; one left over is a bug.
		return nil, errors.New("partial JSON update left unapplied")
	}
	return nil, unexpected(v)
}

// decodeJSONText validates a JSON document and returns a copy as RawJSON,
// to be embedded (re-emitted canonically) by the encoder.
func decodeJSONText(s string) (any, error) {
	b := []byte(s)
	if !canonical.ValidJSON(b) {
		return nil, fmt.Errorf("invalid JSON document %.64q", s)
	}
	return canonical.RawJSON(b), nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isDate checks the shape "DDDD-DD-DD" (values, including zeros, are the
// server's business).
func isDate(s string) bool {
	return len(s) == 10 && allDigits(s[0:4]) && s[4] == '-' && allDigits(s[5:7]) && s[7] == '-' && allDigits(s[8:10])
}

// isClock checks "H…:MM:SS" with hourDigits hour digits.
func isClock(s string, hourDigits int) bool {
	h := hourDigits
	return len(s) == h+6 && allDigits(s[:h]) && s[h] == ':' && allDigits(s[h+1:h+3]) && s[h+3] == ':' && allDigits(s[h+4:h+6])
}

// validDecimal checks the shape go-mysql prints DECIMAL in: optional '-',
// digits, optional '.' and digits.
func validDecimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || !allDigits(intPart) {
		return false
	}
	return !hasDot || (frac != "" && allDigits(frac))
}

// TypeName names the column's type for error messages, e.g. "DATETIME(3)"
// or "INT UNSIGNED".
func (c *Column) TypeName() string {
	var name string
	switch t := c.realType(); t {
	case gomysql.MYSQL_TYPE_TINY:
		name = "TINYINT"
	case gomysql.MYSQL_TYPE_SHORT:
		name = "SMALLINT"
	case gomysql.MYSQL_TYPE_INT24:
		name = "MEDIUMINT"
	case gomysql.MYSQL_TYPE_LONG:
		name = "INT"
	case gomysql.MYSQL_TYPE_LONGLONG:
		name = "BIGINT"
	case gomysql.MYSQL_TYPE_YEAR:
		return "YEAR"
	case gomysql.MYSQL_TYPE_NEWDECIMAL, gomysql.MYSQL_TYPE_DECIMAL:
		return fmt.Sprintf("DECIMAL(%d,%d)", c.Meta>>8, c.Meta&0xFF)
	case gomysql.MYSQL_TYPE_FLOAT:
		return "FLOAT"
	case gomysql.MYSQL_TYPE_DOUBLE:
		return "DOUBLE"
	case gomysql.MYSQL_TYPE_BIT:
		return fmt.Sprintf("BIT(%d)", (c.Meta>>8)*8+c.Meta&0xFF)
	case gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_NEWDATE:
		return "DATE"
	case gomysql.MYSQL_TYPE_DATETIME, gomysql.MYSQL_TYPE_DATETIME2:
		return withFsp("DATETIME", c.fsp(t))
	case gomysql.MYSQL_TYPE_TIMESTAMP, gomysql.MYSQL_TYPE_TIMESTAMP2:
		return withFsp("TIMESTAMP", c.fsp(t))
	case gomysql.MYSQL_TYPE_TIME, gomysql.MYSQL_TYPE_TIME2:
		return withFsp("TIME", c.fsp(t))
	case gomysql.MYSQL_TYPE_ENUM:
		return "ENUM"
	case gomysql.MYSQL_TYPE_SET:
		return "SET"
	case gomysql.MYSQL_TYPE_JSON:
		return "JSON"
	case gomysql.MYSQL_TYPE_GEOMETRY:
		return "GEOMETRY"
	case gomysql.MYSQL_TYPE_VECTOR:
		return "VECTOR"
	case gomysql.MYSQL_TYPE_BLOB, gomysql.MYSQL_TYPE_TINY_BLOB, gomysql.MYSQL_TYPE_MEDIUM_BLOB, gomysql.MYSQL_TYPE_LONG_BLOB:
		switch {
		case c.JSON:
			return "JSON (LONGTEXT)"
		case c.Geometry:
			return "GEOMETRY"
		case isBinaryCharset(c.Charset):
			return "BLOB"
		}
		return "TEXT " + c.Charset
	case gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING:
		if isBinaryCharset(c.Charset) {
			return "VARBINARY"
		}
		return "VARCHAR " + c.Charset
	case gomysql.MYSQL_TYPE_STRING:
		if isBinaryCharset(c.Charset) {
			return "BINARY"
		}
		return "CHAR " + c.Charset
	default:
		return "type " + strconv.Itoa(int(t))
	}
	if c.Unsigned {
		name += " UNSIGNED"
	}
	return name
}

func withFsp(name string, fsp int) string {
	if fsp == 0 {
		return name
	}
	return name + "(" + strconv.Itoa(fsp) + ")"
}
