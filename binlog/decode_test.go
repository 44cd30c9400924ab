package binlog

import (
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cdcout/cdcout/canonical"
)

// The inputs below are what go-mysql v1.16's decodeValue returns for each
// type (ParseTime false, UseDecimal false, TimestampStringLocation UTC).
func TestColumnDecode(t *testing.T) {
	enum := []string{"small", "médium", "large"}
	set := []string{"a", "b", "c", "d"}
	tests := []struct {
		name string
		col  Column
		in   any
		want string // canonical JSON of the result
	}{
		{"null", Column{Type: gomysql.MYSQL_TYPE_LONG}, nil, `null`},
		{"tinyint min", Column{Type: gomysql.MYSQL_TYPE_TINY}, int8(-128), `-128`},
		{"tinyint unsigned from metadata", Column{Type: gomysql.MYSQL_TYPE_TINY}, uint8(255), `255`},
		{"tinyint unsigned from column", Column{Type: gomysql.MYSQL_TYPE_TINY, Unsigned: true}, int8(-1), `255`},
		{"smallint min", Column{Type: gomysql.MYSQL_TYPE_SHORT}, int16(-32768), `-32768`},
		{"smallint unsigned from column", Column{Type: gomysql.MYSQL_TYPE_SHORT, Unsigned: true}, int16(-1), `65535`},
		{"mediumint min", Column{Type: gomysql.MYSQL_TYPE_INT24}, int32(-8388608), `-8388608`},
		{"mediumint unsigned from column", Column{Type: gomysql.MYSQL_TYPE_INT24, Unsigned: true}, int32(-1), `16777215`},
		{"mediumint unsigned", Column{Type: gomysql.MYSQL_TYPE_INT24, Unsigned: true}, uint32(16777215), `16777215`},
		{"int min", Column{Type: gomysql.MYSQL_TYPE_LONG}, int32(math.MinInt32), `-2147483648`},
		{"int unsigned from column", Column{Type: gomysql.MYSQL_TYPE_LONG, Unsigned: true}, int32(-1), `4294967295`},
		{"bigint min", Column{Type: gomysql.MYSQL_TYPE_LONGLONG}, int64(math.MinInt64), `-9223372036854775808`},
		{"bigint unsigned max", Column{Type: gomysql.MYSQL_TYPE_LONGLONG, Unsigned: true}, uint64(math.MaxUint64), `18446744073709551615`},
		{"bigint unsigned max from column", Column{Type: gomysql.MYSQL_TYPE_LONGLONG, Unsigned: true}, int64(-1), `18446744073709551615`},
		{"year", Column{Type: gomysql.MYSQL_TYPE_YEAR}, 2155, `2155`},
		{"year zero", Column{Type: gomysql.MYSQL_TYPE_YEAR}, 0, `0`},
		{"decimal", Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 10<<8 | 3}, "1.500", `"1.500"`},
		{"decimal negative", Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 10<<8 | 3}, "-0.001", `"-0.001"`},
		{"decimal 65,30", Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 65<<8 | 30},
			"-99999999999999999999999999999999999.999999999999999999999999999999", `"-99999999999999999999999999999999999.999999999999999999999999999999"`},
		{"decimal integral", Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 5 << 8}, "12345", `"12345"`},
		{"float", Column{Type: gomysql.MYSQL_TYPE_FLOAT}, float32(0.1), `0.1`},
		{"float max", Column{Type: gomysql.MYSQL_TYPE_FLOAT}, float32(-3.4028235e38), `-3.4028235e+38`},
		{"double", Column{Type: gomysql.MYSQL_TYPE_DOUBLE}, 1.7976931348623157e308, `1.7976931348623157e+308`},
		{"double small", Column{Type: gomysql.MYSQL_TYPE_DOUBLE}, 2.2250738585072014e-308, `2.2250738585072014e-308`},
		{"bit 1", Column{Type: gomysql.MYSQL_TYPE_BIT, Meta: 1}, int64(1), `1`},
		{"bit 64 all ones", Column{Type: gomysql.MYSQL_TYPE_BIT, Meta: 8 << 8}, int64(-1), `18446744073709551615`},
		{"date", Column{Type: gomysql.MYSQL_TYPE_DATE}, "2024-02-29", `"2024-02-29"`},
		{"date min", Column{Type: gomysql.MYSQL_TYPE_DATE}, "1000-01-01", `"1000-01-01"`},
		{"date zero", Column{Type: gomysql.MYSQL_TYPE_DATE}, "0000-00-00", `"0000-00-00"`},
		{"date partial zero", Column{Type: gomysql.MYSQL_TYPE_DATE}, "2024-00-00", `"2024-00-00"`},
		{"datetime", Column{Type: gomysql.MYSQL_TYPE_DATETIME2}, "2024-01-02 03:04:05", `"2024-01-02T03:04:05"`},
		{"datetime(6)", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 6, Decimals: 6}, "9999-12-31 23:59:59.999999", `"9999-12-31T23:59:59.999999"`},
		{"datetime(3) zero frac", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 3}, "2024-01-02 03:04:05.000", `"2024-01-02T03:04:05.000"`},
		{"datetime(2) padded", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 2}, "2024-01-02 03:04:05", `"2024-01-02T03:04:05.00"`},
		{"datetime zero", Column{Type: gomysql.MYSQL_TYPE_DATETIME2}, "0000-00-00 00:00:00", `"0000-00-00T00:00:00"`},
		{"datetime(4) zero", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 4}, "0000-00-00 00:00:00.0000", `"0000-00-00T00:00:00.0000"`},
		{"datetime old type", Column{Type: gomysql.MYSQL_TYPE_DATETIME}, "1999-12-31 23:59:59", `"1999-12-31T23:59:59"`},
		{"timestamp", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2}, "2038-01-19 03:14:07", `"2038-01-19T03:14:07Z"`},
		{"timestamp(6)", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2, Meta: 6}, "1970-01-01 00:00:01.000001", `"1970-01-01T00:00:01.000001Z"`},
		{"timestamp(1)", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2, Meta: 1}, "2020-05-06 07:08:09.5", `"2020-05-06T07:08:09.5Z"`},
		{"timestamp zero", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2}, "0000-00-00 00:00:00", `"0000-00-00T00:00:00Z"`},
		{"timestamp(2) epoch fraction", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2, Meta: 2}, "0000-00-00 00:00:00.01", `"1970-01-01T00:00:00.01Z"`},
		{"timestamp(6) epoch fraction", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2, Meta: 6}, "0000-00-00 00:00:00.000001", `"1970-01-01T00:00:00.000001Z"`},
		{"datetime(2) zero date with fraction stays", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 2}, "0000-00-00 00:00:00.01", `"0000-00-00T00:00:00.01"`},
		{"timestamp(3) zero", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2, Meta: 3}, "0000-00-00 00:00:00.000", `"0000-00-00T00:00:00.000Z"`},
		{"time", Column{Type: gomysql.MYSQL_TYPE_TIME2}, "12:34:56", `"12:34:56"`},
		{"time max", Column{Type: gomysql.MYSQL_TYPE_TIME2}, "838:59:59", `"838:59:59"`},
		{"time min", Column{Type: gomysql.MYSQL_TYPE_TIME2}, "-838:59:59", `"-838:59:59"`},
		{"time(6) negative", Column{Type: gomysql.MYSQL_TYPE_TIME2, Meta: 6}, "-00:00:00.000001", `"-00:00:00.000001"`},
		{"time(3) whole second", Column{Type: gomysql.MYSQL_TYPE_TIME2, Meta: 3}, "12:00:00", `"12:00:00.000"`},
		{"time(2) zero", Column{Type: gomysql.MYSQL_TYPE_TIME2, Meta: 2}, "00:00:00", `"00:00:00.00"`},
		{"time(1) negative", Column{Type: gomysql.MYSQL_TYPE_TIME2, Meta: 1}, "-01:02:03.5", `"-01:02:03.5"`},
		{"time(3) negative whole", Column{Type: gomysql.MYSQL_TYPE_TIME2, Meta: 3}, "-100:00:00", `"-100:00:00.000"`},
		{"enum", Column{Type: gomysql.MYSQL_TYPE_ENUM, EnumValues: enum, Charset: "utf8mb4"}, int64(2), `"médium"`},
		{"enum via string meta", Column{Type: gomysql.MYSQL_TYPE_STRING, Meta: uint16(gomysql.MYSQL_TYPE_ENUM)<<8 | 1, EnumValues: enum, Charset: "utf8mb4"}, int64(3), `"large"`},
		{"enum latin1 member", Column{Type: gomysql.MYSQL_TYPE_ENUM, EnumValues: []string{"caf\xe9"}, Charset: "latin1"}, int64(1), `"café"`},
		{"enum latin1 member from information_schema", Column{Type: gomysql.MYSQL_TYPE_ENUM, EnumValues: []string{"café"}, Charset: "latin1"}, int64(1), `"café"`},
		{"enum ucs2 member", Column{Type: gomysql.MYSQL_TYPE_ENUM, EnumValues: []string{"\x00\xe9"}, Charset: "ucs2"}, int64(1), `"é"`},
		{"set latin1 members", Column{Type: gomysql.MYSQL_TYPE_SET, SetValues: []string{"\xe0", "b"}, Charset: "latin1"}, int64(3), `["à","b"]`},
		{"enum error value", Column{Type: gomysql.MYSQL_TYPE_ENUM, EnumValues: enum}, int64(0), `""`},
		{"set", Column{Type: gomysql.MYSQL_TYPE_SET, SetValues: set, Charset: "utf8mb4"}, int64(0b1101), `["a","c","d"]`},
		{"set empty", Column{Type: gomysql.MYSQL_TYPE_SET, SetValues: set}, int64(0), `[]`},
		{"set 64 members", Column{Type: gomysql.MYSQL_TYPE_SET, SetValues: sixtyFour()}, int64(math.MinInt64), `["m63"]`},
		{"varchar utf8mb4 emoji", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "utf8mb4"}, "h\u00e9 😀", `"hé 😀"`},
		{"char utf8mb3", Column{Type: gomysql.MYSQL_TYPE_STRING, Meta: 0xfe<<8 | 30, Charset: "utf8mb3"}, "ab", `"ab"`},
		{"varchar latin1", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "latin1"}, "caf\xe9 \x80 \x81 \xff", `"café € ` + "\u0081" + ` ÿ"`},
		{"text latin1 blob bytes", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 2, Charset: "latin1"}, []byte("na\xefve \x9f"), `"naïve Ÿ"`},
		{"text utf8mb4", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 2, Charset: "utf8mb4"}, []byte("line\n\"q\""), `"line\n\"q\""`},
		{"text latin2", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 2, Charset: "latin2"}, []byte("\xb1"), `"ą"`},
		{"text cp1251", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "cp1251"}, "\xcf\xf0\xe8", `"При"`},
		{"text ucs2", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "ucs2"}, "\x00A\x00\xe9", `"Aé"`},
		{"text gbk", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "gbk"}, "\xc4\xe3\xba\xc3", `"你好"`},
		{"varbinary", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "binary"}, "\xff\x00\xfe", `"/wD+"`},
		{"binary padded", Column{Type: gomysql.MYSQL_TYPE_STRING, Meta: 0xfe<<8 | 4, Charset: "binary"}, "\xff", `"/wAAAA=="`},
		{"binary full", Column{Type: gomysql.MYSQL_TYPE_STRING, Meta: 0xfe<<8 | 2, Charset: "binary"}, "\x00\x01", `"AAE="`},
		{"blob", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 2, Charset: "binary"}, []byte{0x80, 0x81}, `"gIE="`},
		{"blob no charset", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 4}, []byte{}, `""`},
		{"geometry", Column{Type: gomysql.MYSQL_TYPE_GEOMETRY, Meta: 4, Geometry: true}, []byte{0, 0, 0, 0, 1, 1, 0, 0, 0}, `"AAAAAAEBAAAA"`},
		{"mysql json", Column{Type: gomysql.MYSQL_TYPE_JSON, Meta: 4, JSON: true}, `{"b": [1, 2.5], "a": "é"}`, `{"a":"é","b":[1,2.5]}`},
		{"mysql json empty", Column{Type: gomysql.MYSQL_TYPE_JSON, Meta: 4, JSON: true}, []byte{}, `null`},
		{"mariadb json", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 4, Charset: "utf8mb4", JSON: true},
			[]byte(`{"z": {"y": 1, "x": 18446744073709551616}, "a": [true, null, "\u00e9"]}`), `{"a":[true,null,"é"],"z":{"x":18446744073709551616,"y":1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.col.Name = "c"
			got, err := tt.col.Decode(tt.in)
			if err != nil {
				t.Fatalf("Decode(%#v): %v", tt.in, err)
			}
			b, err := canonical.Marshal(got)
			if err != nil {
				t.Fatalf("Marshal(%#v): %v", got, err)
			}
			if string(b) != tt.want {
				t.Fatalf("Decode(%#v) = %s, want %s", tt.in, b, tt.want)
			}
		})
	}
}

func sixtyFour() []string {
	s := make([]string, 64)
	for i := range s {
		s[i] = "m" + string(rune('0'+i/10)) + string(rune('0'+i%10))
	}
	return s
}

// go-mysql's strings and BLOBs alias its event buffer; decoded values must
// not.
func TestColumnDecodeCopies(t *testing.T) {
	buf := []byte("hello")
	col := Column{Name: "b", Type: gomysql.MYSQL_TYPE_BLOB, Meta: 2, Charset: "binary"}
	got, err := col.Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	text := Column{Name: "t", Type: gomysql.MYSQL_TYPE_BLOB, Meta: 2, Charset: "utf8mb4"}
	gotText, err := text.Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	geo := Column{Name: "g", Type: gomysql.MYSQL_TYPE_GEOMETRY, Meta: 4, Geometry: true}
	gotGeo, err := geo.Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXX")
	if string(got.([]byte)) != "hello" || gotText.(string) != "hello" || string(gotGeo.([]byte)) != "hello" {
		t.Fatalf("decoded values alias the input: %q %q %q", got, gotText, gotGeo)
	}
}

func TestColumnDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		col  Column
		in   any
		msg  string
	}{
		{"int as string", Column{Type: gomysql.MYSQL_TYPE_LONG}, "1", "INT"},
		{"unsigned bigint wrong type", Column{Type: gomysql.MYSQL_TYPE_LONGLONG, Unsigned: true}, 1.5, "BIGINT UNSIGNED"},
		{"decimal malformed", Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 10<<8 | 2}, "1e5", "DECIMAL(10,2)"},
		{"decimal as float", Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 10<<8 | 2}, 1.5, "DECIMAL"},
		{"date malformed", Column{Type: gomysql.MYSQL_TYPE_DATE}, "2024-1-1", "DATE"},
		{"datetime malformed", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 3}, "2024-01-01T00:00:00", "DATETIME(3)"},
		{"datetime too many digits", Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 2}, "2024-01-01 00:00:00.123", "DATETIME(2)"},
		{"timestamp wrong type", Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2}, int64(5), "TIMESTAMP"},
		{"time malformed", Column{Type: gomysql.MYSQL_TYPE_TIME2}, "1:2:3", "TIME"},
		{"enum out of range", Column{Type: gomysql.MYSQL_TYPE_ENUM, EnumValues: []string{"a"}}, int64(2), "ENUM"},
		{"enum without members", Column{Type: gomysql.MYSQL_TYPE_ENUM}, int64(1), "ENUM"},
		{"set beyond members", Column{Type: gomysql.MYSQL_TYPE_SET, SetValues: []string{"a"}}, int64(2), "SET"},
		{"utf8mb4 invalid", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "utf8mb4"}, "\xff", "VARCHAR utf8mb4"},
		{"unknown charset", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "klingon"}, "\xff", "klingon"},
		{"undecodable byte", Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "cp1251"}, "\x98", "cp1251"},
		{"json invalid", Column{Type: gomysql.MYSQL_TYPE_JSON, Meta: 4}, "{", "JSON"},
		{"mariadb json invalid", Column{Type: gomysql.MYSQL_TYPE_BLOB, Meta: 4, Charset: "utf8mb4", JSON: true}, []byte("nope"), "JSON (LONGTEXT)"},
		{"json partial", Column{Type: gomysql.MYSQL_TYPE_JSON, Meta: 4}, &replication.JsonDiff{}, "left unapplied"},
		{"json corrupt binary", Column{Type: gomysql.MYSQL_TYPE_JSON, Meta: 4}, mysqlJSONB{0x42}, "corrupt binary JSON"},
		{"json truncated object", Column{Type: gomysql.MYSQL_TYPE_JSON, Meta: 4}, mysqlJSONB{jsonbSmallObject, 5, 0}, "corrupt binary JSON"},
		{"unknown type", Column{Type: 0x42}, int64(1), "type 66"},
		{"float as double", Column{Type: gomysql.MYSQL_TYPE_FLOAT}, 1.5, "FLOAT"},
		{"bit wrong type", Column{Type: gomysql.MYSQL_TYPE_BIT, Meta: 1}, uint8(1), "BIT(1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.col.Name = "col_x"
			got, err := tt.col.Decode(tt.in)
			if err == nil {
				t.Fatalf("Decode(%#v) = %#v, want error", tt.in, got)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			full := inTable(err, "shop", "items").Error()
			for _, want := range []string{"shop.items.col_x", tt.msg} {
				if !strings.Contains(full, want) {
					t.Fatalf("error %q does not mention %q", full, want)
				}
			}
		})
	}
	if err := inTable(errors.New("other"), "a", "b"); err.Error() != "other" {
		t.Fatalf("inTable changed a foreign error: %v", err)
	}
}

func BenchmarkColumnDecode(b *testing.B) {
	cols := []struct {
		col Column
		in  any
	}{
		{Column{Type: gomysql.MYSQL_TYPE_LONGLONG, Unsigned: true}, uint64(123456789)},
		{Column{Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "utf8mb4"}, "some customer name"},
		{Column{Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 10<<8 | 2}, "1234.50"},
		{Column{Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 6}, "2024-01-02 03:04:05.123456"},
		{Column{Type: gomysql.MYSQL_TYPE_TIMESTAMP2, Meta: 0}, "2024-01-02 03:04:05"},
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, c := range cols {
			if _, err := c.col.Decode(c.in); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// MariaDB 10.11: HEX(CONVERT(CONVERT(UNHEX('80…9F') USING latin1) USING
// utf8mb4)), i.e. the server's own latin1 → UTF-8 mapping of the bytes
// where latin1 differs from ISO 8859-1.
const serverLatin1High = "E282ACC281E2809AC692E2809EE280A6E280A0E280A1CB86E280B0C5A0E280B9C592C28DC5BDC28FC290E28098E28099E2809CE2809DE280A2E28093E28094CB9CE284A2C5A1E280BAC593C29DC5BEC5B8"

func TestLatin1MatchesServer(t *testing.T) {
	var in []byte
	for c := 0x80; c < 0xA0; c++ {
		in = append(in, byte(c))
	}
	if got := strings.ToUpper(hex.EncodeToString([]byte(decodeLatin1(string(in))))); got != serverLatin1High {
		t.Fatalf("latin1 0x80..0x9F decodes to\n%s\nserver says\n%s", got, serverLatin1High)
	}
	in = in[:0]
	for c := 0xA0; c <= 0xFF; c++ {
		in = append(in, byte(c))
	}
	for i, r := range []rune(decodeLatin1(string(in))) {
		if r != rune(0xA0+i) {
			t.Fatalf("latin1 %#x decodes to %U", 0xA0+i, r)
		}
	}
}

// BenchmarkDecodeRow decodes the row BenchmarkStreamVsRaw inserts, as
// go-mysql hands it over.
func BenchmarkDecodeRow(b *testing.B) {
	t := &Table{Columns: []Column{
		{Name: "id", Type: gomysql.MYSQL_TYPE_LONGLONG},
		{Name: "a", Type: gomysql.MYSQL_TYPE_LONG},
		{Name: "b", Type: gomysql.MYSQL_TYPE_VARCHAR, Charset: "utf8mb4"},
		{Name: "c", Type: gomysql.MYSQL_TYPE_NEWDECIMAL, Meta: 12<<8 | 2},
		{Name: "d", Type: gomysql.MYSQL_TYPE_DATETIME2, Meta: 3},
		{Name: "e", Type: gomysql.MYSQL_TYPE_DOUBLE},
		{Name: "f", Type: gomysql.MYSQL_TYPE_BLOB, Charset: "utf8mb4"},
		{Name: "g", Type: gomysql.MYSQL_TYPE_TINY, Unsigned: true},
	}}
	vals := []any{int64(123456), int32(456), "name-123456", "1234.56", "2024-05-07 17:25:45.123",
		185184.0, []byte(strings.Repeat("x", 40)), uint8(64)}
	var out []any
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if _, out, err = decodeRow(t, vals, out); err != nil {
			b.Fatal(err)
		}
	}
}
