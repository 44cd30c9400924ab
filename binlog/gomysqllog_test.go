package binlog

import (
	"errors"
	"log/slog"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestGoMySQLLogging: go-mysql's records reach zap at a level that fits
// what they mean; the syncer config (which holds the password) never does.
func TestGoMySQLLogging(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	l := goMySQLLogger(zap.New(core))
	l.Info("create BinlogSyncer", slog.Any("config", struct{ Password string }{"hunter2"}))
	l.Error("kill connection", slog.Any("error", errors.New("ERROR 1094 (HY000): Unknown thread id: 42")), slog.Int64("id", 42))
	l.Info("syncer is closed")
	l.Info("Connected to server", slog.String("flavor", "mariadb"))
	l.Error("kill connection", slog.Any("error", errors.New("ERROR 1045: Access denied")), slog.Int64("id", 43))
	l.With("k", "v").Info("syncer is closing...")

	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Level.String()+" "+e.Message)
	}
	want := []string{"info Connected to server", "error kill connection"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("logged %q, want %q", got, want)
	}

	// At debug level the demoted records are there, the config is not.
	core, logs = observer.New(zapcore.DebugLevel)
	l = goMySQLLogger(zap.New(core))
	l.Info("create BinlogSyncer", slog.Any("config", struct{ Password string }{"hunter2"}))
	l.Error("kill connection", slog.Any("error", errors.New("Unknown thread id: 42")))
	if all := logs.All(); len(all) != 1 || all[0].Level != zapcore.DebugLevel || all[0].Message != "kill connection" {
		t.Fatalf("debug: %+v", all)
	}
}
