package logbridge_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcout/cdcout/internal/logbridge"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

// Issue 14, defect 6: the MySQL driver's own log lines (here: an idle
// connection the server side reset) come out through zap, not as raw
// "[mysql] …" lines beside the JSON log.
func TestMySQLDriverLogsThroughZap(t *testing.T) {
	srv := mysqltest.Shared(t)
	core, logs := observer.New(zapcore.DebugLevel)
	logbridge.RouteMySQLDriver(zap.New(core).Named("mysql"))
	defer logbridge.RouteMySQLDriver(zap.NewNop())

	dsn, proxy := srv.ProxiedDSN(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Reset() // the pooled connection is now dead
	deadline := time.Now().Add(5 * time.Second)
	for logs.Len() == 0 && time.Now().Before(deadline) {
		// The driver notices the dead idle connection on reuse, logs it
		// and retries on a fresh one.
		if err := db.PingContext(ctx); err != nil {
			t.Logf("ping: %v", err)
		}
	}
	entries := logs.All()
	if len(entries) == 0 {
		t.Fatal("the driver logged nothing through zap after its idle connection was reset")
	}
	e := entries[0]
	if e.Level != zapcore.WarnLevel || e.LoggerName != "mysql" || !strings.Contains(e.Message, "connection") {
		t.Fatalf("driver entry = level %v logger %q message %q; want a warn from logger mysql about the connection", e.Level, e.LoggerName, e.Message)
	}
}
