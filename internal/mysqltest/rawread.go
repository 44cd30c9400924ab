package mysqltest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/logbridge"
)

// readerIDs gives every benchmark reader of the process its own
// replication server id, far from the ids tests and replicas use.
var readerIDs atomic.Uint32

// ReaderServerID is a replication server id of its own for a benchmark's
// binlog reader (the bare read, or another library's reader).
func ReaderServerID() uint32 { return 2_000_000_000 + readerIDs.Add(1) }

// GoMySQLFlavor is the server's product as go-mysql names it.
func (s *Server) GoMySQLFlavor() string {
	if s.Flavor == MySQL {
		return gomysql.MySQLFlavor
	}
	return gomysql.MariaDBFlavor
}

// RawReadRate reads the binlog from the GTID position from (in the
// server's flavour's notation) with a
// bare go-mysql BinlogSyncer (rows parsed, nothing else) until it has seen
// want row changes of database db (an update's two images count once), and
// returns changes/s: the ceiling any binlog reader in Go has here, for
// benchmarks to compare against.
func (s *Server) RawReadRate(tb testing.TB, db, from string, want int) float64 {
	tb.Helper()
	flavor := s.GoMySQLFlavor()
	gset, err := gomysql.ParseGTIDSet(flavor, from)
	if err != nil {
		tb.Fatal(err)
	}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID:                ReaderServerID(),
		Flavor:                  flavor,
		Host:                    s.Host,
		Port:                    uint16(s.Port),
		User:                    s.User,
		Password:                s.Password,
		TimestampStringLocation: time.UTC,
		Logger:                  logbridge.New(zap.NewNop()),
	})
	defer syncer.Close()
	t0 := time.Now()
	streamer, err := syncer.StartSyncGTID(gset)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n := 0
	for n < want {
		ev, err := streamer.GetEvent(ctx)
		if err != nil {
			tb.Fatalf("raw read after %d changes: %v", n, err)
		}
		re, ok := ev.Event.(*replication.RowsEvent)
		if !ok || string(re.Table.Schema) != db {
			continue
		}
		switch ev.Header.EventType {
		case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2, replication.PARTIAL_UPDATE_ROWS_EVENT:
			n += len(re.Rows) / 2 // before and after image per change
		default:
			n += len(re.Rows)
		}
	}
	return float64(n) / time.Since(t0).Seconds()
}
