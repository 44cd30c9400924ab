package httpsink

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cdcout/cdcout/outbox"
)

// BenchmarkDeliver posts b.N records to an in-process receiver the way
// the drainer hands them over: with one POST per record (single) as 50
// concurrent calls of 16 records, in batch mode as 8 concurrent calls of
// 100. cpu_us/record is the whole process's CPU (receiver included) per
// record, which unlike ns/op does not depend on how many cores were free.
func BenchmarkDeliver(b *testing.B) {
	for _, c := range []struct {
		name        string
		batch       bool
		calls, size int
	}{
		{"single", false, 50, 16},
		{"batch", true, 8, 100},
	} {
		b.Run(c.name, func(b *testing.B) { benchDeliver(b, c.batch, c.calls, c.size) })
	}
}

func benchDeliver(b *testing.B, batch bool, calls, size int) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
	}))
	defer srv.Close()
	s, err := New(Options{URL: srv.URL, Batch: batch})
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"id":"0193a7a1-0000-7000-8000-000000000000","op":"u","source":{"db":"shop","table":"orders"},"before":{"id":1,"v":0,"pad":"padpadpadpadpadpadpadpadpadpad"},"after":{"id":1,"v":1,"pad":"padpadpadpadpadpadpadpadpadpad"}}`)
	recs := make([]outbox.Record, b.N)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("0193a7a1-%04x-7000-8000-%012x", i%0xffff, i), string(payload))
	}
	// Warm up: connections open and the limit grown, as in a long run.
	warm := s.Deliver(context.Background(), recs[:min(len(recs), size)])
	for _, err := range warm {
		if err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	b.ResetTimer()
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				hi := int(next.Add(int64(size)))
				lo := hi - size
				if lo >= len(recs) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				for _, err := range s.Deliver(ctx, recs[lo:min(hi, len(recs))]) {
					if err != nil {
						failed.Add(1)
					}
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d records not delivered", n)
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu_us/record")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
