package engine

import (
	"context"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink/pubsubsink"
	"github.com/cdcout/cdcout/sink/redissink"
)

// redisSink builds a redis:// or rediss:// sink; its credentials, database
// and trimming come from the URL.
func (e *Engine) redisSink(sc config.Sink) (outbox.Sink, error) {
	o, err := redissink.ParseURL(sc.URL)
	if err != nil {
		return nil, err
	}
	o.Format, o.Logger = sc.Format, e.log
	return e.closing(redissink.New(o))
}

// pubsubSink builds a pubsub:// sink; credentials are the client
// library's defaults (PUBSUB_EMULATOR_HOST for an emulator).
func (e *Engine) pubsubSink(sc config.Sink) (outbox.Sink, error) {
	o, err := pubsubsink.ParseURL(sc.URL)
	if err != nil {
		return nil, err
	}
	o.Format, o.Timeout = sc.Format, sc.Timeout
	return e.closing(pubsubsink.New(context.Background(), o))
}
