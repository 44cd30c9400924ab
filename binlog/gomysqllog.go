package binlog

import (
	"context"
	"log/slog"
	"strings"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/logbridge"
)

// goMySQLLogger is the logger handed to go-mysql's BinlogSyncer: its
// records go to log, less the ones that mislead or say nothing.
func goMySQLLogger(log *zap.Logger) *slog.Logger {
	return slog.New(goMySQLHandler{logbridge.New(log).Handler()})
}

// goMySQLHandler sorts go-mysql's records before the bridge sees them.
//
//   - "create BinlogSyncer" carries the whole syncer config: it holds the
//     password, and zap cannot encode it anyway (every start logged
//     "configError: json: unsupported type: func(*client.Conn) error").
//     It is dropped: "binlog source ready" says what matters.
//   - "kill connection … Unknown thread id" at error level is a reconnect
//     finding its old connection already gone: debug.
//   - The syncer's own lifecycle chatter (closing, closed, kill last
//     connection, retry sync disabled — cdcout reconnects itself and says
//     so) is debug.
//
// Everything else keeps its level.
type goMySQLHandler struct{ slog.Handler }

func (h goMySQLHandler) Enabled(ctx context.Context, l slog.Level) bool {
	// Records may be demoted in Handle, never promoted: asking at the
	// record's own level is enough.
	return h.Handler.Enabled(ctx, l)
}

func (h goMySQLHandler) Handle(ctx context.Context, r slog.Record) error {
	switch r.Message {
	case "create BinlogSyncer":
		return nil
	case "syncer is closing...", "syncer is closed", "kill last connection", "retry sync is disabled",
		"receive EOF packet, no more binlog event now.":
		r.Level = slog.LevelDebug
	case "kill connection":
		gone := false
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" && strings.Contains(a.Value.String(), "Unknown thread id") {
				gone = true
			}
			return !gone
		})
		if gone {
			r.Level = slog.LevelDebug
		}
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h goMySQLHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return goMySQLHandler{h.Handler.WithAttrs(attrs)}
}

func (h goMySQLHandler) WithGroup(name string) slog.Handler {
	return goMySQLHandler{h.Handler.WithGroup(name)}
}
