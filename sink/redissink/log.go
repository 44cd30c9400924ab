package redissink

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// zapLogging bridges go-redis's process-wide logger (pool dial failures and
// the like) to zap, so that they reach the service's structured log instead
// of stderr. go-redis has one logger per process: the first sink made sets
// it.
type zapLogging struct{ log *zap.Logger }

func (l zapLogging) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug("redis client", zap.String("message", fmt.Sprintf(format, v...)))
}

var setLogger sync.Once

func bridgeLogger(log *zap.Logger) {
	setLogger.Do(func() { redis.SetLogger(zapLogging{log: log}) })
}
