package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

func TestScratchEnqueueTiming(t *testing.T) {
	srv := mysqltest.Shared(t)
	p, err := state.Open(srv.DSN, 0)
	if err != nil {
		t.Fatal(err)
	}
	schema := srv.CreateDB(t, "scr")
	if err := state.Migrate(t.Context(), p.DB, schema); err != nil {
		t.Fatal(err)
	}
	s := NewStore(p.DB, schema, zap.NewNop())
	fence := grantLease(t, p.DB, schema, "enqueue/bench", "r1", 1, time.Hour)
	ctx := context.Background()
	var total time.Duration
	c0, _ := srv.CPUTime()
	o0 := mysqltest.OwnCPUTime()
	const n, per = 40, 1000
	for i := 0; i < n; i++ {
		var items []Pending
		for j := 0; j < per; j++ {
			for _, pipe := range []string{"a:app.users:hook", "a:app.users:file"} {
				c := &canonical.Change{
					Op:     canonical.OpCreate,
					After:  canonical.Row{"id": int64(i*per + j), "v": int64(0), "pad": "padpadpadpadpadpadpadpadpadpad"},
					Key:    canonical.Row{"id": int64(i*per + j)},
					Source: canonical.Source{Connector: "cdcout", DB: "app", Table: "users", GTID: fmt.Sprint("0-1-", i), Row: j, TsMs: 1_700_000_000_123},
					TsMs:   1_700_000_000_456,
				}
				k := dedup.GTIDKey(c.Source.GTID, j)
				items = append(items, Pending{Pipe: pipe, Sink: sinkOf(pipe), Change: c, ChangeKey: k, Unit: dedup.GTIDUnitOf(k),
					Digest: canonical.DigestChange(pipe, c)})
			}
		}
		cp := &Checkpoint{Source: "enqueue/bench", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: fmt.Sprint("0-1-", i)}}
		t0 := time.Now()
		if _, err := s.Enqueue(ctx, "r1", fence, items, cp); err != nil {
			t.Fatal(err)
		}
		total += time.Since(t0)
	}
	c1, _ := srv.CPUTime()
	o1 := mysqltest.OwnCPUTime()
	t.Logf("%d batches of %d changes × 2 pipes: %.1f ms per batch; db %.2f µs/change, test process %.2f µs/change", n, per, float64(total.Microseconds())/1e3/n,
		float64((c1-c0).Microseconds())/float64(n*per), float64((o1-o0).Microseconds())/float64(n*per))
}
