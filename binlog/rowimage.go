package binlog

import (
	"encoding/binary"
	"fmt"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// MySQL JSON columns reach the decoder as raw binary JSON (mysqlJSONB) or,
// for a partial update, as the text of the document with the update
// applied (jsonText); see jsonb.go for why go-mysql's own JSON decoding is
// not used.
type (
	mysqlJSONB []byte
	jsonText   []byte
)

// decodePartialJSONRows decodes the row images of a
// PARTIAL_UPDATE_ROWS_EVENT (the only rows event go-mysql types as
// unknown) of a table with MySQL JSON columns. Its after images carry a
// bitmap over the JSON columns, so it cannot be decoded with the JSON
// columns as BLOBs the way whole images are (decodeTableMap); it is
// decoded as is and the JSON values are then taken from the raw images by
// walkImages.
func decodePartialJSONRows(e *replication.RowsEvent, data []byte, pos int, jsonCols []int) error {
	if err := e.DecodeData(pos, data); err != nil {
		return err
	}
	images, err := walkImages(e, data[pos:], len(jsonCols))
	if err != nil {
		return fmt.Errorf("partial update rows event of %s.%s: %w", e.Table.Schema, e.Table.Table, err)
	}
	if len(images) != len(e.Rows) || len(images)%2 != 0 {
		return fmt.Errorf("partial update rows event of %s.%s: %d images walked, %d decoded", e.Table.Schema, e.Table.Table, len(images), len(e.Rows))
	}
	for i, img := range images {
		row := e.Rows[i]
		for _, v := range img {
			if v.data == nil {
				row[v.col] = nil
				continue
			}
			if !v.partial {
				row[v.col] = mysqlJSONB(v.data)
				continue
			}
			before, ok := e.Rows[i-1][v.col].(mysqlJSONB)
			if !ok || len(before) == 0 {
				return fmt.Errorf("partial update of %s.%s column %d: the before image holds no document to apply it to (binlog_row_image must be FULL)", e.Table.Schema, e.Table.Table, v.col)
			}
			after, err := applyJSONDiffs(before, v.data)
			if err != nil {
				return fmt.Errorf("%s.%s column %d: %w", e.Table.Schema, e.Table.Table, v.col, err)
			}
			row[v.col] = jsonText(after)
		}
	}
	return nil
}

// jsonColumns lists the table's MySQL JSON columns.
func jsonColumns(tm *replication.TableMapEvent) []int {
	var cols []int
	for i, t := range tm.ColumnType {
		if t == gomysql.MYSQL_TYPE_JSON {
			cols = append(cols, i)
		}
	}
	return cols
}

// rawJSON is one JSON column's value in one row image: the binary JSON,
// or with partial the diff list, or nil for SQL NULL.
type rawJSON struct {
	col     int
	data    []byte
	partial bool
}

// walkImages walks the row images of a PARTIAL_UPDATE_ROWS_EVENT in data
// (the event body after its header) the way the server wrote them
// (Rows_log_event::print_verbose) and returns each image's JSON column
// values; jsonCount is the table's number of JSON columns. It decodes
// nothing else, only measures; it must end exactly at the end of the data,
// so a misreading is an error, never a wrong value.
func walkImages(e *replication.RowsEvent, data []byte, jsonCount int) (images [][]rawJSON, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed row image: %v", r)
		}
	}()
	tm := e.Table
	pos := 0
	for pos < len(data) {
		before, n, err := walkImage(tm, data[pos:], e.ColumnBitmap1, false, 0)
		if err != nil {
			return nil, err
		}
		pos += n
		after, n, err := walkImage(tm, data[pos:], e.ColumnBitmap2, true, jsonCount)
		if err != nil {
			return nil, err
		}
		pos += n
		images = append(images, before, after)
	}
	if pos != len(data) {
		return nil, fmt.Errorf("row images end at byte %d of %d", pos, len(data))
	}
	return images, nil
}

func walkImage(tm *replication.TableMapEvent, data, bitmap []byte, partialAfter bool, jsonCount int) ([]rawJSON, int, error) {
	pos := 0
	var partialBits []byte
	if partialAfter {
		opts, _, n := gomysql.LengthEncodedInt(data)
		pos += n
		if opts&1 != 0 { // PARTIAL_JSON_UPDATES
			nb := (jsonCount + 7) / 8
			partialBits = data[pos : pos+nb]
			pos += nb
		}
	}
	present := 0
	for i := 0; i < len(tm.ColumnType); i++ {
		if bitSet(bitmap, i) {
			present++
		}
	}
	nulls := data[pos : pos+(present+7)/8]
	pos += (present + 7) / 8
	var out []rawJSON
	jsonIndex, nullIndex := 0, 0
	for i, tp := range tm.ColumnType {
		isJSON := tp == gomysql.MYSQL_TYPE_JSON
		partial := false
		if isJSON && partialBits != nil {
			partial = bitSet(partialBits, jsonIndex)
		}
		if isJSON {
			jsonIndex++
		}
		if !bitSet(bitmap, i) {
			continue
		}
		null := bitSet(nulls, nullIndex)
		nullIndex++
		if null {
			if isJSON {
				out = append(out, rawJSON{col: i})
			}
			continue
		}
		n, err := valueLen(tp, tm.ColumnMeta[i], data[pos:])
		if err != nil {
			return nil, 0, fmt.Errorf("column %d: %w", i, err)
		}
		if isJSON {
			m := int(tm.ColumnMeta[i])
			out = append(out, rawJSON{col: i, data: data[pos+m : pos+n], partial: partial})
		}
		pos += n
	}
	return out, pos, nil
}

func bitSet(bitmap []byte, i int) bool { return bitmap[i>>3]&(1<<(uint(i)&7)) != 0 }

// valueLen is the stored length of one column value in a row image, by the
// table map's type and metadata (log_event.cc's log_event_print_value).
func valueLen(tp byte, meta uint16, data []byte) (int, error) {
	if tp == gomysql.MYSQL_TYPE_STRING && meta >= 256 {
		b0, b1 := byte(meta>>8), byte(meta&0xff)
		if b0&0x30 != 0x30 {
			// CHAR longer than 255 bytes: the length's high bits live in b0.
			length := int(b1) | int((b0&0x30)^0x30)<<4
			return stringLen(length, data), nil
		}
		switch b0 {
		case gomysql.MYSQL_TYPE_ENUM, gomysql.MYSQL_TYPE_SET:
			return int(b1), nil
		}
		return stringLen(int(b1), data), nil
	}
	switch tp {
	case gomysql.MYSQL_TYPE_NULL:
		return 0, nil
	case gomysql.MYSQL_TYPE_TINY, gomysql.MYSQL_TYPE_YEAR:
		return 1, nil
	case gomysql.MYSQL_TYPE_SHORT:
		return 2, nil
	case gomysql.MYSQL_TYPE_INT24, gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_TIME, gomysql.MYSQL_TYPE_NEWDATE:
		return 3, nil
	case gomysql.MYSQL_TYPE_LONG, gomysql.MYSQL_TYPE_FLOAT, gomysql.MYSQL_TYPE_TIMESTAMP:
		return 4, nil
	case gomysql.MYSQL_TYPE_LONGLONG, gomysql.MYSQL_TYPE_DOUBLE, gomysql.MYSQL_TYPE_DATETIME:
		return 8, nil
	case gomysql.MYSQL_TYPE_TIMESTAMP2:
		return 4 + (int(meta)+1)/2, nil
	case gomysql.MYSQL_TYPE_DATETIME2:
		return 5 + (int(meta)+1)/2, nil
	case gomysql.MYSQL_TYPE_TIME2:
		return 3 + (int(meta)+1)/2, nil
	case gomysql.MYSQL_TYPE_NEWDECIMAL:
		prec, scale := int(meta>>8), int(meta&0xff)
		intg := prec - scale
		return intg/9*4 + decimalDigitBytes[intg%9] + scale/9*4 + decimalDigitBytes[scale%9], nil
	case gomysql.MYSQL_TYPE_BIT:
		nbits := int(meta>>8)*8 + int(meta&0xff)
		return (nbits + 7) / 8, nil
	case gomysql.MYSQL_TYPE_ENUM, gomysql.MYSQL_TYPE_SET:
		return int(meta & 0xff), nil
	case gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING, gomysql.MYSQL_TYPE_STRING:
		return stringLen(int(meta), data), nil
	case gomysql.MYSQL_TYPE_BLOB, gomysql.MYSQL_TYPE_GEOMETRY, gomysql.MYSQL_TYPE_JSON, gomysql.MYSQL_TYPE_VECTOR,
		gomysql.MYSQL_TYPE_TINY_BLOB, gomysql.MYSQL_TYPE_MEDIUM_BLOB, gomysql.MYSQL_TYPE_LONG_BLOB:
		if meta < 1 || meta > 4 {
			return 0, fmt.Errorf("length prefix of %d bytes", meta)
		}
		var b [8]byte
		copy(b[:], data[:meta])
		return int(meta) + int(binary.LittleEndian.Uint64(b[:])), nil
	}
	return 0, fmt.Errorf("column type %d has no known stored length", tp)
}

// stringLen: strings of up to 255 bytes have a 1-byte length, longer ones 2.
func stringLen(maxLen int, data []byte) int {
	if maxLen < 256 {
		return 1 + int(data[0])
	}
	return 2 + int(binary.LittleEndian.Uint16(data))
}
