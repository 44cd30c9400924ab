package outbox

import (
	"fmt"
	"testing"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
)

// BenchmarkPrepareBatch is the enqueue's work outside its transaction on
// a batch of 1,000 realistic changes (the columns of BenchmarkFileEndToEnd's
// realistic workload, images encoded once as the engine does): keying,
// envelopes and compressed segments. No database is involved.
func BenchmarkPrepareBatch(b *testing.B) {
	s := NewStore(nil, "cdcout", nil)
	const pipe = "a:shop.orders:hook"
	items := make([]Pending, 1000)
	for i := range items {
		c := &canonical.Change{
			Op: canonical.OpUpdate,
			Before: canonical.Row{"id": int64(i), "name": fmt.Sprint("customer ", i), "qty": int64(3), "price": "1234.50",
				"created": "2024-01-02 03:04:05.123456", "doc": canonical.RawJSON(`{"tags":["a","b"],"n":1}`),
				"blob": []byte("0123456789abcdef0123456789abcdef"), "ratio": 0.25},
			After: canonical.Row{"id": int64(i), "name": fmt.Sprint("customer ", i), "qty": int64(4), "price": "1299.00",
				"created": "2024-01-02 03:04:05.123456", "doc": canonical.RawJSON(`{"tags":["a"],"n":2}`),
				"blob": []byte("0123456789abcdef0123456789abcdef"), "ratio": 0.5},
			Key:    canonical.Row{"id": int64(i)},
			Source: canonical.Source{Connector: "cdcout", DB: "shop", Table: "orders", GTID: fmt.Sprint("0-1-", i/100), Row: i % 100, TsMs: 1_700_000_000_123},
			TsMs:   1_700_000_000_456,
		}
		im, err := canonical.EncodeImages(c)
		if err != nil {
			b.Fatal(err)
		}
		items[i] = Pending{Pipe: pipe, Sink: PipeSink(pipe), Change: c, Images: im,
			ChangeKey: dedup.GTIDKey(c.Source.GTID, i%100), Unit: "u" + c.Source.GTID,
			Digest: canonical.DigestImages(pipe, c, im)}
	}
	b.ReportAllocs()
	for b.Loop() {
		batch, err := s.PrepareBatch(items, nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(batch.segs) != 1 || batch.segs[0].records != len(items) {
			b.Fatalf("%d segments, want 1 of %d records", len(batch.segs), len(items))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/change")
}
