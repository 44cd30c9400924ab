package binlog

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cdcout/cdcout/canonical"
)

// decodeBothWays decodes one stored value of a one-column table through
// go-mysql twice, under the table map itself and under decodeTableMap's
// copy, and each result through the column's Decode, and returns the
// canonical JSON (or error) of each.
func decodeBothWays(t testing.TB, tm *replication.TableMapEvent, stored []byte) (plain, patched string) {
	t.Helper()
	col := Column{Name: "c", Type: realType(tm, 0), Meta: tm.ColumnMeta[0], Unsigned: tm.UnsignedMap()[0]}
	col.Decimals = metaDecimals(col.Type, col.Meta)
	cp, fix := decodeTableMap(tm)
	if cp == tm {
		t.Fatalf("decodeTableMap left a table map with type %d unchanged", tm.ColumnType[0])
	}
	one := func(m *replication.TableMapEvent) string {
		e := &replication.RowsEvent{Table: m, ColumnCount: 1, ColumnBitmap1: []byte{1}}
		if err := e.DecodeData(0, append([]byte{0}, stored...)); err != nil {
			return "go-mysql: " + err.Error()
		}
		if m == cp {
			fix.apply(e.Rows)
		}
		v, err := col.Decode(e.Rows[0][0])
		if err != nil {
			return "error: " + err.Error()
		}
		b, err := canonical.Marshal(v)
		if err != nil {
			return "marshal: " + err.Error()
		}
		return string(b)
	}
	return one(tm), one(cp)
}

// Every stored DATETIME2, valid or not, decodes to the same value (or the
// same error) whether go-mysql formats it or decodePackedDatetime does.
func TestPackedDatetimeMatchesGoMySQL(t *testing.T) {
	// 2024-02-29 13:14:15, the zero value, and one that is not a date.
	valid := uint64(datetimeIntOffset) + (uint64((2024*13+2)<<5|29)<<17 | uint64(13<<12|14<<6|15))
	r := rand.New(rand.NewPCG(19, 1))
	for fsp := range 7 {
		width := datetime2Bytes(fsp)
		fracBits := 8 * (width - 5)
		values := []uint64{
			valid << fracBits, valid<<fracBits | 1, valid<<fracBits | (1<<fracBits - 1),
			datetimeIntOffset << fracBits, datetimeIntOffset<<fracBits | 1, 0, 1<<(8*width) - 1,
		}
		for range 3000 {
			values = append(values, r.Uint64()&(1<<(8*width)-1))
		}
		for _, v := range values {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], v<<(64-8*width))
			tm := &replication.TableMapEvent{ColumnCount: 1, ColumnType: []byte{gomysql.MYSQL_TYPE_DATETIME2}, ColumnMeta: []uint16{uint16(fsp)}}
			plain, patched := decodeBothWays(t, tm, b[:width])
			if plain != patched {
				t.Fatalf("DATETIME(%d) stored %x: go-mysql's text gives %s, the packed form %s", fsp, b[:width], plain, patched)
			}
		}
	}
}

// Unsigned integers decode the same without the signedness bitmap
// (decodeTableMap drops it): Column.Unsigned, read from it, reinterprets
// go-mysql's signed values.
func TestUnsignedWithoutSignednessBitmap(t *testing.T) {
	types := []struct {
		typ   byte
		width int
	}{
		{gomysql.MYSQL_TYPE_TINY, 1}, {gomysql.MYSQL_TYPE_SHORT, 2}, {gomysql.MYSQL_TYPE_INT24, 3},
		{gomysql.MYSQL_TYPE_LONG, 4}, {gomysql.MYSQL_TYPE_LONGLONG, 8},
	}
	for _, tt := range types {
		for _, bitmap := range []byte{0x80, 0x00} {
			for _, v := range []uint64{0, 1, 127, 128, 255, 1 << 15, 1<<16 - 1, 1 << 23, 1<<24 - 1, 1 << 31, 1<<32 - 1, 1 << 63, 1<<64 - 1} {
				var b [8]byte
				binary.LittleEndian.PutUint64(b[:], v)
				tm := &replication.TableMapEvent{ColumnCount: 1, ColumnType: []byte{tt.typ}, ColumnMeta: []uint16{0}, SignednessBitmap: []byte{bitmap}}
				plain, patched := decodeBothWays(t, tm, b[:tt.width])
				if plain != patched {
					t.Fatalf("type %d (bitmap %#x) stored %x: %s with the bitmap, %s without", tt.typ, bitmap, b[:tt.width], plain, patched)
				}
			}
		}
	}
}

func FuzzPackedDatetime(f *testing.F) {
	f.Add(uint8(6), []byte("\x99\xb2\x7a\xd3\x8f\x07\xa1\x20"))
	f.Add(uint8(0), []byte("\x80\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, fsp uint8, stored []byte) {
		fsp %= 7
		width := datetime2Bytes(int(fsp))
		if len(stored) < width {
			return
		}
		tm := &replication.TableMapEvent{ColumnCount: 1, ColumnType: []byte{gomysql.MYSQL_TYPE_DATETIME2}, ColumnMeta: []uint16{uint16(fsp)}}
		plain, patched := decodeBothWays(t, tm, stored[:width])
		if plain != patched {
			t.Fatalf("DATETIME(%d) stored %x: go-mysql's text gives %s, the packed form %s", fsp, stored[:width], plain, patched)
		}
	})
}
