package logbridge

import (
	"errors"
	"log/slog"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestBridge(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	l := New(zap.New(core)).With("conn", 7).WithGroup("sync")
	l.Debug("dropped")
	l.Info("rotate", slog.String("file", "binlog.000002"), slog.Any("error", errors.New("boom")))
	l.Error("retry", slog.Group("pos", slog.Int("n", 4)))

	entries := logs.All()
	if got, want := len(entries), 2; got != want {
		t.Fatalf("entries = %d, want %d", got, want)
	}
	e := entries[0]
	if got, want := e.Message, "rotate"; got != want {
		t.Fatalf("message = %q, want %q", got, want)
	}
	m := e.ContextMap()
	if got, want := m["conn"], int64(7); got != want {
		t.Fatalf("conn = %v, want %v", got, want)
	}
	if got, want := m["sync.file"], "binlog.000002"; got != want {
		t.Fatalf("sync.file = %v, want %v", got, want)
	}
	if got, want := m["sync.error"], "boom"; got != want {
		t.Fatalf("sync.error = %v, want %v", got, want)
	}
	if got, want := entries[1].Level, zapcore.ErrorLevel; got != want {
		t.Fatalf("level = %v, want %v", got, want)
	}
	if got, want := entries[1].ContextMap()["sync.pos.n"], int64(4); got != want {
		t.Fatalf("sync.pos.n = %v, want %v", got, want)
	}
}
