package engine

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/sink/filesink"
	"github.com/cdcout/cdcout/sink/httpsink"
	"github.com/cdcout/cdcout/sink/kafkasink"
	"github.com/cdcout/cdcout/sink/natssink"
	"github.com/cdcout/cdcout/sink/stdoutsink"
)

// sinkEntry is a configured sink and the outbox.Sink built from it.
type sinkEntry struct {
	cfg  config.Sink
	sink outbox.Sink
}

// buildSink selects the sink type by URL scheme. One package per external
// client; an explicit switch, no registry.
func (e *Engine) buildSink(sc config.Sink) (outbox.Sink, error) {
	f, err := format.New(sc.Format)
	if err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(sc.URL, ":")
	switch strings.ToLower(scheme) {
	case "stdout":
		return stdoutsink.New(e.stdout, f), nil
	case "file":
		p, err := filesink.PathOf(sc.URL)
		if err != nil {
			return nil, err
		}
		s, err := filesink.Open(p, f)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, s)
		return s, nil
	case "http", "https":
		secret, err := httpsink.ParseSecret(sc.Secret.Value())
		if err != nil {
			return nil, err
		}
		headers := map[string]string{}
		for k, v := range sc.Headers {
			headers[k] = v.Value()
		}
		o := httpsink.Options{URL: sc.URL, Secret: secret, Headers: headers, Format: f, Timeout: sc.Timeout,
			Logger: e.log.Named("http").With(zap.String("sink", sc.Name))}
		if sc.HTTP != nil {
			o.Batch, o.MaxConcurrency = sc.HTTP.Batch, sc.HTTP.MaxConcurrency
		}
		return e.closing(httpsink.New(o))
	case "kafka":
		brokers, topic, err := kafkasink.ParseURL(sc.URL)
		if err != nil {
			return nil, err
		}
		o := kafkasink.Options{Brokers: brokers, TopicTemplate: topic, Format: sc.Format, Logger: e.log}
		if k := sc.Kafka; k != nil {
			o.TLS = tlsOptions(k.TLS)
			if a := k.SASL; a != nil {
				o.SASL = &kafkasink.SASLOptions{Mechanism: a.Mechanism, Username: a.Username, Password: a.Password.Value()}
			}
		}
		return e.closing(kafkasink.New(context.Background(), o))
	case "nats":
		server, subject, err := natssink.ParseURL(sc.URL)
		if err != nil {
			return nil, err
		}
		o := natssink.Options{URL: server, SubjectTemplate: subject, Format: sc.Format, Logger: e.log}
		if n := sc.NATS; n != nil {
			o.CredentialsFile, o.User, o.Password, o.Token = n.CredentialsFile, n.User, n.Password.Value(), n.Token.Value()
			o.TLS = tlsOptions(n.TLS)
		}
		return e.closing(natssink.New(context.Background(), o))
	case "redis", "rediss":
		return e.redisSink(sc)
	case "pubsub":
		return e.pubsubSink(sc)
	default:
		return nil, fmt.Errorf("unknown sink scheme %q", scheme)
	}
}

// closerFunc adapts a sink's Close without a result to io.Closer.
type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

// clientSink is a sink that holds a client to close at shutdown (kafka,
// nats, redis, pubsub), or goroutines to end (http).
type clientSink interface {
	outbox.Sink
	Close()
}

// closing takes what a client sink's New returned: on success the sink's
// Close runs when the engine closes its sinks.
func (e *Engine) closing(s clientSink, err error) (outbox.Sink, error) {
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, closerFunc(s.Close))
	return s, nil
}

// tlsOptions is a sink's TLS configuration; nil without one.
func tlsOptions(t *config.TLS) *sink.TLSOptions {
	if t == nil {
		return nil
	}
	return &sink.TLSOptions{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, InsecureSkipVerify: t.InsecureSkipVerify}
}

func (e *Engine) closeSinks() {
	for _, c := range e.closers {
		if err := c.Close(); err != nil {
			e.log.Warn("close sink", zap.Error(err))
		}
	}
	e.closers = nil
}

// endpointer is a sink that reports its endpoint's adaptive concurrency.
type endpointer interface {
	Endpoint() sink.LimiterStats
}

// endpointStats lists the adaptive concurrency state of the sinks that
// pace themselves.
func (e *Engine) endpointStats() []metrics.EndpointStat {
	var out []metrics.EndpointStat
	for name, se := range e.sinks {
		if ep, ok := se.sink.(endpointer); ok {
			out = append(out, metrics.EndpointStat{Sink: name, LimiterStats: ep.Endpoint()})
		}
	}
	return out
}

// endpoints is endpointStats for /v1/sinks.
func (e *Engine) endpoints() map[string]inspect.EndpointStatus {
	out := map[string]inspect.EndpointStatus{}
	for name, se := range e.sinks {
		ep, ok := se.sink.(endpointer)
		if !ok {
			continue
		}
		st := ep.Endpoint()
		rtt, floor := st.Millis()
		out[name] = inspect.EndpointStatus{Limit: st.Limit, Max: st.Max, InFlight: st.InFlight, RTTMs: rtt, FloorMs: floor,
			PausedFor: st.PausedFor.Seconds(), Overloads: st.Overloads}
	}
	return out
}
