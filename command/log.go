package command

import (
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/cdcout/cdcout/internal/logbridge"
)

// newLogger builds the process logger: JSON when w is not a terminal (so log
// shippers parse it), console otherwise; format "json" or "console"
// overrides the guess.
func newLogger(w io.Writer, level, format string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, ConfigErrorf("--log-level: %q is not one of debug, info, warn, error", level)
	}
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			format = "console"
		}
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		encCfg.EncodeLevel = zapcore.CapitalColorLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, ConfigErrorf("--log-format: %q is not json or console", format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	logger := zap.New(core)
	// The MySQL driver logs process-wide; without this its raw lines
	// would interleave with the JSON log.
	logbridge.RouteMySQLDriver(logger.Named("mysql"))
	return logger, nil
}
