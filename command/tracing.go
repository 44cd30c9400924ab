package command

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/internal/tracing"
)

// startTracing turns on OpenTelemetry export when the OTEL_EXPORTER_OTLP_*
// environment asks for it (package tracing); the returned func flushes
// the spans still buffered, bounded so that a collector that is gone does
// not hold up the stop.
func startTracing(ctx context.Context, cfg *config.Config, logger *zap.Logger) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, cfg.ReplicaID, buildinfo.Version())
	if err != nil {
		return nil, err
	}
	if tracing.Enabled() {
		logger.Info("tracing on: one span per delivery attempt, exported over OTLP/HTTP")
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			logger.Warn("flush traces", zap.Error(err))
		}
	}, nil
}
