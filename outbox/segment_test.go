package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

func testSegRecords(n int) []*segRecord {
	recs := make([]*segRecord, n)
	for i := range recs {
		key := fmt.Sprintf(`{"id":%d}`, i)
		sum := sha256.Sum256([]byte(key))
		id := fmt.Sprintf("0193a1b2-c3d4-7e5f-8a9b-%012d", i)
		recs[i] = &segRecord{id: id, changeKey: fmt.Sprintf("g:0-1-%d:%d", 100+i/10, i%10), db: "app", tbl: "users",
			op: "u", rowKey: key, keyHash: hex.EncodeToString(sum[:]), commitTS: time.UnixMicro(1_764_000_000_000_000 + int64(i)).UTC(),
			payload: []byte(fmt.Sprintf(`{"after":{"id":%d,"name":"n%d"},"id":%q}`, i, i, id))}
	}
	return recs
}

// Both formats give back every field, the key hash of format 2 computed
// from the row key; format 2 is the smaller, and a reader of version 1
// only (the byte check of releases before it) stops at it.
func TestSegmentFormatsRoundTrip(t *testing.T) {
	recs := testSegRecords(50)
	want := make([]segRecord, len(recs))
	for i, r := range recs {
		want[i] = *r
	}
	sizes := map[int]int{}
	for _, format := range []int{SegmentFormat1, SegmentFormat2} {
		plain := appendSegment(nil, recs, format)
		stored := compressSegment(nil, plain)
		sizes[format] = len(stored)
		for name, b := range map[string][]byte{"compressed": stored, "plain": plain} {
			got, err := parseSegment(b)
			if err != nil {
				t.Fatalf("format %d %s: %v", format, name, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("format %d %s: parsed\n%+v\nwant\n%+v", format, name, got[0], want[0])
			}
		}
		if oldReaderAccepts := plain[0] == segmentVersion; oldReaderAccepts != (format == SegmentFormat1) {
			t.Fatalf("format %d starts with version byte %d", format, plain[0])
		}
	}
	if sizes[SegmentFormat2] >= sizes[SegmentFormat1]-50*50 {
		t.Fatalf("format 2 is %d bytes compressed, format 1 %d: want at least 50 bytes a record less", sizes[SegmentFormat2], sizes[SegmentFormat1])
	}
}

func TestParseSegmentRejectsCorrupt(t *testing.T) {
	plain := appendSegment(nil, testSegRecords(3), SegmentFormat2)
	for name, b := range map[string][]byte{
		"empty":           nil,
		"unknown version": append([]byte{9}, plain[1:]...),
		"cut short":       plain[:len(plain)-3],
		"bad s2":          {segmentS2, 0xff, 0xff, 0xff},
	} {
		if _, err := parseSegment(b); !errors.Is(err, errSegmentCorrupt) {
			t.Fatalf("%s: err = %v, want errSegmentCorrupt", name, err)
		}
	}
}

// FuzzParseSegment: any input parses or fails with errSegmentCorrupt,
// never panics, and what parses writes back (in its own version) to the
// same records.
func FuzzParseSegment(f *testing.F) {
	for _, format := range []int{SegmentFormat1, SegmentFormat2} {
		plain := appendSegment(nil, testSegRecords(3), format)
		f.Add(plain)
		f.Add(compressSegment(nil, plain))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := parseSegment(b)
		if err != nil {
			if !errors.Is(err, errSegmentCorrupt) {
				t.Fatalf("err = %v, want errSegmentCorrupt", err)
			}
			return
		}
		ptrs := make([]*segRecord, len(recs))
		for i := range recs {
			ptrs[i] = &recs[i]
		}
		for _, format := range []int{SegmentFormat1, SegmentFormat2} {
			again, err := parseSegment(appendSegment(nil, ptrs, format))
			if err != nil {
				t.Fatalf("format %d: re-encoded records do not parse: %v", format, err)
			}
			if format == SegmentFormat2 {
				// Format 2 keeps no key hash: it is the row key's.
				for i := range recs {
					sum := sha256.Sum256([]byte(recs[i].rowKey))
					recs[i].keyHash = hex.EncodeToString(sum[:])
				}
			}
			if len(again) != len(recs) || (len(recs) > 0 && !reflect.DeepEqual(again, recs)) {
				t.Fatalf("format %d: re-encoded records parse to others", format)
			}
		}
	})
}

// BenchmarkParseSegment: the drain's decode of a 1,000-record segment,
// per record.
func BenchmarkParseSegment(b *testing.B) {
	for _, format := range []int{SegmentFormat1, SegmentFormat2} {
		b.Run(fmt.Sprint("format", format), func(b *testing.B) {
			stored := compressSegment(nil, appendSegment(nil, testSegRecords(1000), format))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseSegment(stored); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/record")
		})
	}
}

// TestSetSegmentFormatReachesCopies: SetSegmentFormat (segment_format
// auto) changes the format of the copies the With methods made, the one
// the engine's enqueue uses, for the segments prepared after it.
func TestSetSegmentFormatReachesCopies(t *testing.T) {
	base := NewStore(nil, "cdcout", nil).WithSegmentFormat(0)
	s := base.WithRecent(NewRecent(1 << 20))
	var items []Pending
	for i := 0; i < 10; i++ {
		items = append(items, gtidItem("a:app.users:hook", 1, i))
	}
	for _, f := range []int{SegmentFormat1, SegmentFormat2, SegmentFormat1} {
		base.SetSegmentFormat(f)
		b, err := s.PrepareBatch(items, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.segs) == 0 {
			t.Fatal("no segment prepared")
		}
		for _, seg := range b.segs {
			if got, err := SegmentFormatOf(seg.payload); err != nil || got != f {
				t.Errorf("after SetSegmentFormat(%d) a copy's segment is format %d (%v)", f, got, err)
			}
		}
	}
	if _, err := SegmentFormatOf([]byte{9, 9}); err == nil {
		t.Error("SegmentFormatOf took an unknown version")
	}
}
