package kafkasink

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"go.uber.org/zap"
)

type kgoSASL = sasl.Mechanism

// zapLogger bridges franz-go's logger to zap. Only warnings and errors are
// passed on: franz-go's info level narrates every metadata refresh.
type zapLogger struct{ l *zap.Logger }

func (zapLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (z zapLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := make([]zap.Field, 0, len(keyvals)/2)
	for i := 0; i+1 < len(keyvals); i += 2 {
		k, _ := keyvals[i].(string)
		fields = append(fields, zap.Any(k, keyvals[i+1]))
	}
	switch level {
	case kgo.LogLevelError:
		z.l.Error(msg, fields...)
	case kgo.LogLevelWarn:
		z.l.Warn(msg, fields...)
	default:
		z.l.Debug(msg, fields...)
	}
}
