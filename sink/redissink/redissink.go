// Package redissink delivers outbox records to Redis Streams.
//
// Each record is appended with XADD to the stream its template names, as
// the fields id (the deliveryKey), pipe, key, op, content-type and body
// (the record in the sink's format). Redis 7 has no idempotent XADD, so a
// record retried after a lost reply, or published again by a second
// replica, is appended again under the same id: consumers drop those by
// the id field (package consumer's Dedup does). A record counts as
// delivered once the server has answered its XADD. A call's records are
// sent in one pipeline; per-key order comes from the drainer, which never
// hands out a key's next record before the previous one is delivered.
package redissink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/tracing"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// DefaultStreamTemplate names the stream when the URL has no path.
const DefaultStreamTemplate = "cdcout.{instance}.{db}.{table}"

// TLSOptions enables TLS; see sink.TLSOptions.
type TLSOptions = sink.TLSOptions

// Options configure a Sink. Addr is required.
type Options struct {
	// Addr is host:port.
	Addr     string
	Username string
	Password string
	// DB is the logical database number (SELECT).
	DB int
	// StreamTemplate is expanded per record: {db}, {table} and {instance}
	// are replaced by the record's values. Default DefaultStreamTemplate.
	StreamTemplate string
	// MaxLen, when positive, trims each stream to about that many entries
	// (XADD MAXLEN ~): Redis keeps a stream in memory, and nothing else
	// bounds it.
	MaxLen int64
	// Format is the body format (format.New); default debezium.
	Format string
	TLS    *TLSOptions
	Logger *zap.Logger
}

// Sink appends records to Redis streams. It is safe for concurrent Deliver
// calls.
type Sink struct {
	client *redis.Client
	format format.Format
	stream func(outbox.Record) (string, error)
	maxLen int64
}

var _ outbox.Sink = (*Sink)(nil)

// ParseURL reads
// "redis[s]://[user:password@]host:port[/stream-template][?db=N&maxlen=N]"
// into Options (TLS for rediss://). Template braces may be written
// literally or percent-encoded. Errors never repeat the password.
func ParseURL(raw string) (Options, error) {
	var o Options
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "redis" && scheme != "rediss") {
		return o, errors.New("redis url: want redis://[user:password@]host:port/stream-template")
	}
	if scheme == "rediss" {
		o.TLS = &TLSOptions{}
	}
	rest, query, _ := strings.Cut(rest, "?")
	hostPart, tmpl, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hostPart, '@'); at >= 0 {
		user, pass, _ := strings.Cut(hostPart[:at], ":")
		var err1, err2 error
		o.Username, err1 = neturl.PathUnescape(user)
		o.Password, err2 = neturl.PathUnescape(pass)
		if err1 != nil || err2 != nil {
			return o, errors.New("redis url: user info is not valid percent-encoding")
		}
		hostPart = hostPart[at+1:]
	}
	if hostPart == "" {
		return o, errors.New("redis url: no host (want redis://host:port/stream-template)")
	}
	if !strings.Contains(hostPart, ":") {
		hostPart += ":6379"
	}
	o.Addr = hostPart
	o.StreamTemplate = format.UnescapeBraces(tmpl)
	q, err := neturl.ParseQuery(query)
	if err != nil {
		return o, fmt.Errorf("redis url query: %w", err)
	}
	for k, v := range q {
		n, err := strconv.ParseInt(v[len(v)-1], 10, 64)
		if err != nil || n < 0 {
			return o, fmt.Errorf("redis url: %s=%q is not a non-negative integer", k, v[len(v)-1])
		}
		switch k {
		case "db":
			o.DB = int(n)
		case "maxlen":
			o.MaxLen = n
		default:
			return o, fmt.Errorf("redis url: unknown parameter %q (want db, maxlen)", k)
		}
	}
	return o, nil
}

// New makes the client. It does not connect: a server that is down at
// start is not an error, and deliveries fail (and retry) until it is back.
func New(o Options) (*Sink, error) {
	if o.Addr == "" {
		return nil, errors.New("redis sink: no address")
	}
	f, err := format.New(o.Format)
	if err != nil {
		return nil, fmt.Errorf("redis sink: %w", err)
	}
	if o.StreamTemplate == "" {
		o.StreamTemplate = DefaultStreamTemplate
	}
	if o.Logger != nil {
		bridgeLogger(o.Logger.Named("redissink"))
	}
	ro := &redis.Options{
		Addr:     o.Addr,
		Username: o.Username,
		Password: o.Password,
		DB:       o.DB,
		// The drainer retries with backoff and knows which records were
		// appended; the client retrying a pipeline on its own could append
		// them twice more.
		MaxRetries: -1,
		// The attempt's timeout (ctx) bounds the round trip, not the
		// client's own 3 s read timeout.
		ContextTimeoutEnabled: true,
	}
	if o.TLS != nil {
		if ro.TLSConfig, err = o.TLS.Config(); err != nil {
			return nil, fmt.Errorf("redis sink: %w", err)
		}
	}
	return &Sink{
		client: redis.NewClient(ro),
		format: f,
		stream: format.NameTemplate(o.StreamTemplate, func(s string) string { return s }),
		maxLen: o.MaxLen,
	}, nil
}

// Close closes the client's connections.
func (s *Sink) Close() { s.client.Close() }

// Deliver appends every record in one pipeline and reports each XADD's
// answer. A record whose reply was lost (ctx ended, the connection broke)
// is retried and may be appended twice, under the same id field.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	spans := tracing.Start(ctx, "redis", recs)
	defer func() { spans.End(errs) }()
	cmds := make([]*redis.StringCmd, len(recs))
	streams := make([]string, len(recs))
	pipe := s.client.Pipeline()
	for i, rec := range recs {
		body, stream, err := format.EncodeNamed(s.format, rec, s.stream)
		if err != nil {
			errs[i] = sink.Permanent(err)
			continue
		}
		streams[i] = stream
		values := []any{"id", rec.ID, "pipe", rec.Pipe, "key", rec.Key, "op", string(rec.Op),
			"content-type", s.format.ContentType(), "body", body}
		for k, v := range tracing.Headers(spans.Context(i)) {
			values = append(values, k, v)
		}
		args := &redis.XAddArgs{Stream: streams[i], Values: values}
		if s.maxLen > 0 {
			args.MaxLen, args.Approx = s.maxLen, true
		}
		cmds[i] = pipe.XAdd(ctx, args)
	}
	if pipe.Len() == 0 {
		return errs
	}
	_, execErr := pipe.Exec(ctx)
	for i, c := range cmds {
		if c == nil {
			continue
		}
		err := c.Err()
		if err == nil && c.Val() == "" {
			// Not sent at all (the connection's AUTH failed): the
			// pipeline's error is this record's too.
			err = cmp.Or(execErr, errors.New("no entry id in the answer"))
		}
		if err != nil {
			errs[i] = classify(ctx, streams[i], err)
		}
	}
	return errs
}

func classify(ctx context.Context, stream string, err error) error {
	var netErr net.Error
	switch msg := err.Error(); {
	case ctx.Err() != nil, errors.As(err, &netErr) && netErr.Timeout():
		// A slow answer is the server's pace, not the record's fault.
		return sink.Overloaded(fmt.Errorf("redis XADD to %q: no answer yet (not counted as a delivery attempt): %w", stream, err))
	case strings.HasPrefix(msg, "OOM"), strings.HasPrefix(msg, "LOADING"), strings.HasPrefix(msg, "BUSY"):
		return sink.Overloaded(fmt.Errorf("redis XADD to %q: server cannot take it now (not counted as a delivery attempt): %w", stream, err))
	case strings.HasPrefix(msg, "WRONGTYPE"):
		// Retryable on purpose: the operator can rename or delete the key,
		// and a configuration slip must not turn into dead letters.
		return fmt.Errorf("redis key %q exists and is not a stream; delete or rename it, "+
			"or change the sink's stream template; the record stays pending and is retried: %w", stream, err)
	case strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOPERM"):
		return fmt.Errorf("redis refused the sink's credentials (check the url's user and password); retried: %w", err)
	default:
		return fmt.Errorf("redis XADD to %q: %w", stream, err)
	}
}
