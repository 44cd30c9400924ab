package binlog

import (
	"fmt"
	"slices"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// decodeTableMap returns the table map go-mysql decodes the row images of
// a captured (whole-image) rows event with, and what fix must then do to
// the decoded rows. It is tm itself when nothing needs changing, else a
// copy in which
//
//   - MySQL JSON columns are BLOBs (the same length-prefixed layout), so
//     their values come out as the raw binary JSON (jsonb.go);
//   - DATETIME(n) columns are BIT columns of the same width, so their
//     values come out as the stored integer, which fix formats in the
//     canonical form: go-mysql formats every DATETIME through fmt.Sprintf
//     and the reader then took that string apart again, a tenth of
//     reading a realistic row;
//   - the signedness bitmap is gone: go-mysql builds a map from it for
//     every row image, and Column.Unsigned, read from the same bitmap,
//     reinterprets the signed integers it yields without it (decodeInt).
//
// Nothing else reads the copy; the reader and the schema cache see tm.
// Both run on the syncer's goroutine, ahead of the reader.
func decodeTableMap(tm *replication.TableMapEvent) (*replication.TableMapEvent, rowFix) {
	var fix rowFix
	for i, t := range tm.ColumnType {
		switch {
		case t == gomysql.MYSQL_TYPE_JSON:
			fix.json = append(fix.json, i)
		case packedDatetime(t, tm.ColumnMeta[i]):
			fix.datetime = append(fix.datetime, i)
		}
	}
	if len(tm.SignednessBitmap) == 0 && len(fix.json) == 0 && len(fix.datetime) == 0 {
		return tm, fix
	}
	cp := *tm
	cp.SignednessBitmap = nil
	cp.ColumnType = slices.Clone(tm.ColumnType)
	cp.ColumnMeta = slices.Clone(tm.ColumnMeta)
	for _, c := range fix.json {
		cp.ColumnType[c] = gomysql.MYSQL_TYPE_BLOB
	}
	fix.fsp = make([]int, len(fix.datetime))
	for i, c := range fix.datetime {
		fix.fsp[i] = int(tm.ColumnMeta[c])
		// BIT's metadata is (whole bytes << 8 | spare bits).
		cp.ColumnType[c] = gomysql.MYSQL_TYPE_BIT
		cp.ColumnMeta[c] = uint16(datetime2Bytes(fix.fsp[i])) << 8
	}
	return &cp, fix
}

// rowFix turns the values go-mysql decoded under decodeTableMap's copy
// into what Column.decode expects: MySQL JSON columns' bytes into
// mysqlJSONB, DATETIME2 columns' integers (fsp: each one's fraction
// digits) into datetimeText.
type rowFix struct {
	json, datetime []int
	fsp            []int
}

func (f rowFix) apply(rows [][]any) {
	for _, row := range rows {
		for _, c := range f.json {
			if b, ok := row[c].([]byte); ok {
				row[c] = mysqlJSONB(b)
			}
		}
		for i, c := range f.datetime {
			if n, ok := row[c].(int64); ok {
				row[c] = packedDatetimeText(uint64(n), f.fsp[i])
			}
		}
	}
}

// datetimeText is a DATETIME2 value already in its canonical form
// (packedDatetimeText), for Column.decodeDatetime to take as it is.
type datetimeText string

// packedDatetime reports whether decodeTableMap has go-mysql hand over a
// column's values as the stored integer: DATETIME2 with a valid fraction
// width (anything else is left to go-mysql, and to its error).
func packedDatetime(t byte, meta uint16) bool {
	return t == gomysql.MYSQL_TYPE_DATETIME2 && meta <= 6
}

// datetime2Bytes is a DATETIME2's stored width: 5 bytes of date and time,
// then the fraction's.
func datetime2Bytes(fsp int) int { return 5 + (fsp+1)/2 }

// datetimeIntOffset is what a DATETIME2's 40-bit integer part is stored
// with (DATETIMEF_INT_OFS), so that it sorts as unsigned bytes.
const datetimeIntOffset = 0x8000000000

// packedDatetimeText formats a DATETIME2 (fsp = its fraction digits, 0–6)
// from its stored big-endian bytes, bits, as a datetimeText: exactly what
// Column.decodeDatetime makes of go-mysql's text for it
// ("YYYY-MM-DD HH:MM:SS[.frac]", the fraction cut to fsp digits), without
// that text in between. The arithmetic is go-mysql's decodeDatetime2, so
// every value gives the same result, errors included: a value go-mysql
// would print other than as four year digits, two-digit fields and six
// fraction digits (only a corrupt row holds one) is returned as go-mysql's
// text, for decodeDatetime to reject as before.
func packedDatetimeText(bits uint64, fsp int) any {
	fracBytes := (fsp + 1) / 2
	intPart := int64(bits>>(8*fracBytes)) - datetimeIntOffset
	frac := int64(bits & (1<<(8*fracBytes) - 1))
	switch fracBytes {
	case 1:
		frac *= 10000
	case 2:
		frac *= 100
	}
	var year, month, day, hour, minute, second int
	text := frac > 999999
	if intPart != 0 {
		tmp := intPart<<24 + frac
		if tmp < 0 {
			tmp = -tmp // still negative for the smallest intPart
		}
		ymdhms := tmp >> 24
		text = text || ymdhms < 0
		ymd, hms := ymdhms>>17, ymdhms%(1<<17)
		ym := ymd >> 5
		year, month, day = int(ym/13), int(ym%13), int(ymd%(1<<5))
		hour, minute, second = int(hms>>12), int((hms>>6)%(1<<6)), int(hms%(1<<6))
	}
	if text || year > 9999 {
		s := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d", year, month, day, hour, minute, second)
		if fsp > 0 {
			s = fmt.Sprintf("%s.%06d", s, frac)
			s = s[:len(s)-(6-fsp)]
		}
		return s
	}
	var buf [26]byte
	b := appendDigits(buf[:0], year, 4)
	b = append(b, '-')
	b = appendDigits(b, month, 2)
	b = append(b, '-')
	b = appendDigits(b, day, 2)
	b = append(b, 'T')
	b = appendDigits(b, hour, 2)
	b = append(b, ':')
	b = appendDigits(b, minute, 2)
	b = append(b, ':')
	b = appendDigits(b, second, 2)
	if fsp > 0 {
		var f [6]byte
		appendDigits(f[:0], int(frac), 6)
		b = append(append(b, '.'), f[:fsp]...)
	}
	return datetimeText(b)
}

// appendDigits appends n (0 ≤ n < 10^width) as exactly width decimal
// digits.
func appendDigits(dst []byte, n, width int) []byte {
	start := len(dst)
	for range width {
		dst = append(dst, 0)
	}
	for i := len(dst) - 1; i >= start; i-- {
		dst[i] = byte('0' + n%10)
		n /= 10
	}
	return dst
}
