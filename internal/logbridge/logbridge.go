// Package logbridge routes log/slog records into a zap logger, so libraries
// that take a *slog.Logger (go-mysql's BinlogSyncer) log through the same
// sink, level and format as the rest of cdcout; RouteMySQLDriver does the
// same for go-sql-driver/mysql's process-wide logger.
package logbridge

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a *slog.Logger whose records go to logger.
func New(logger *zap.Logger) *slog.Logger {
	return slog.New(&handler{core: logger.Core(), logger: logger})
}

// handler implements slog.Handler over a zap core. Groups become a dotted
// key prefix: zap namespaces would nest differently per encoder, and a flat
// key is easier to grep.
type handler struct {
	core   zapcore.Core
	logger *zap.Logger
	prefix string
	fields []zap.Field
}

var _ slog.Handler = (*handler)(nil)

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l >= slog.LevelError:
		return zapcore.ErrorLevel
	case l >= slog.LevelWarn:
		return zapcore.WarnLevel
	case l >= slog.LevelInfo:
		return zapcore.InfoLevel
	default:
		return zapcore.DebugLevel
	}
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool {
	return h.core.Enabled(zapLevel(l))
}

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	ce := h.logger.Check(zapLevel(r.Level), r.Message)
	if ce == nil {
		return nil
	}
	fields := make([]zap.Field, 0, len(h.fields)+r.NumAttrs())
	fields = append(fields, h.fields...)
	r.Attrs(func(a slog.Attr) bool {
		fields = appendAttr(fields, h.prefix, a)
		return true
	})
	if !r.Time.IsZero() {
		ce.Time = r.Time
	}
	ce.Write(fields...)
	return nil
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.fields = append([]zap.Field(nil), h.fields...)
	for _, a := range attrs {
		n.fields = appendAttr(n.fields, h.prefix, a)
	}
	return &n
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.prefix = h.prefix + name + "."
	return &n
}

func appendAttr(fields []zap.Field, prefix string, a slog.Attr) []zap.Field {
	v := a.Value.Resolve()
	if a.Key == "" && v.Kind() != slog.KindGroup {
		return fields
	}
	key := prefix + a.Key
	switch v.Kind() {
	case slog.KindGroup:
		p := prefix
		if a.Key != "" {
			p = key + "."
		}
		for _, g := range v.Group() {
			fields = appendAttr(fields, p, g)
		}
		return fields
	case slog.KindString:
		return append(fields, zap.String(key, v.String()))
	case slog.KindInt64:
		return append(fields, zap.Int64(key, v.Int64()))
	case slog.KindUint64:
		return append(fields, zap.Uint64(key, v.Uint64()))
	case slog.KindFloat64:
		return append(fields, zap.Float64(key, v.Float64()))
	case slog.KindBool:
		return append(fields, zap.Bool(key, v.Bool()))
	case slog.KindDuration:
		return append(fields, zap.Duration(key, v.Duration()))
	case slog.KindTime:
		return append(fields, zap.Time(key, v.Time()))
	default:
		if err, ok := v.Any().(error); ok {
			return append(fields, zap.NamedError(key, err))
		}
		return append(fields, zap.Any(key, v.Any()))
	}
}
