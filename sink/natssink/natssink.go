// Package natssink delivers outbox records to NATS JetStream.
//
// Each record is published with Nats-Msg-Id = its deliveryKey, so a stream's
// duplicate window drops what a retry or a second replica publishes again,
// and a record counts as delivered only once the stream has acknowledged
// storing it. A call's records are published asynchronously and their acks
// awaited together; per-key order comes from the drainer, which never hands
// out a key's next record before the previous one is acknowledged.
package natssink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/tracing"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// DefaultSubjectTemplate names the subject when the URL has no path.
const DefaultSubjectTemplate = "cdcout.{instance}.{db}.{table}"

// TLSOptions enables TLS; see sink.TLSOptions.
type TLSOptions = sink.TLSOptions

// Options configure a Sink. URL is required.
type Options struct {
	// URL is the server list, "nats://host:4222[,nats://host2:4222]",
	// without the subject template (see ParseURL).
	URL string
	// SubjectTemplate is expanded per record: {db}, {table} and
	// {instance} are replaced by the record's values, with '.', '*', '>'
	// and whitespace turned into '_' so a name stays one subject token.
	// Default DefaultSubjectTemplate.
	SubjectTemplate string
	// Format is the message body format (format.New); default debezium.
	Format string
	// Name is the connection name the server shows; default "cdcout".
	Name string
	// At most one of CredentialsFile, User/Password and Token.
	CredentialsFile string
	User            string
	Password        string
	Token           string
	TLS             *TLSOptions
	Logger          *zap.Logger
}

// Sink publishes records to JetStream. It is safe for concurrent Deliver
// calls.
type Sink struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	format  format.Format
	subject func(outbox.Record) (string, error)
	logger  *zap.Logger
	// connErr is the last error the connection reported (a failed
	// reconnect, an authorization violation). nc.LastError is cleared while
	// a reconnect is under way, and Deliver must still say why it cannot
	// publish.
	connErr *atomic.Pointer[error]
}

var _ outbox.Sink = (*Sink)(nil)

// ParseURL splits "nats://host:4222/subject-template" into the server URL
// and the subject template ("" when the URL has no path). Several servers
// may be given comma-separated before the path. Template braces may be
// written literally or percent-encoded.
func ParseURL(raw string) (serverURL, subjectTemplate string, err error) {
	rest, ok := strings.CutPrefix(raw, "nats://")
	if !ok {
		return "", "", fmt.Errorf("nats url %q: want nats://host:port/subject-template", raw)
	}
	hosts, tmpl, _ := strings.Cut(rest, "/")
	if strings.TrimSpace(hosts) == "" {
		return "", "", fmt.Errorf("nats url %q: no server", raw)
	}
	var servers []string
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimPrefix(strings.TrimSpace(h), "nats://")
		if h != "" {
			servers = append(servers, "nats://"+h)
		}
	}
	tmpl = format.UnescapeBraces(tmpl)
	return strings.Join(servers, ","), tmpl, nil
}

// New connects to the server. A server that is down at start is not an
// error: the client keeps reconnecting and deliveries fail (and retry)
// until it is back.
func New(ctx context.Context, o Options) (*Sink, error) {
	if o.URL == "" {
		return nil, errors.New("nats sink: no server url")
	}
	f, err := format.New(o.Format)
	if err != nil {
		return nil, fmt.Errorf("nats sink: %w", err)
	}
	logger := o.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	logger = logger.Named("natssink")
	if o.SubjectTemplate == "" {
		o.SubjectTemplate = DefaultSubjectTemplate
	}
	if o.Name == "" {
		o.Name = "cdcout"
	}
	connErr := &atomic.Pointer[error]{}
	noteErr := func(err error) {
		if err != nil {
			connErr.Store(&err)
		}
	}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { noteErr(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { noteErr(err) }),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(-1), // a publish while disconnected fails (and retries) instead of piling up
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			noteErr(err)
			logger.Warn("disconnected from nats", zap.Error(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("reconnected to nats", zap.String("server", nc.ConnectedUrlRedacted()))
		}),
	}
	switch {
	case o.CredentialsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredentialsFile))
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	}
	if o.TLS != nil {
		tc, err := o.TLS.Config()
		if err != nil {
			return nil, fmt.Errorf("nats sink: %w", err)
		}
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		// nats.go's errors name the server, never the credentials.
		return nil, fmt.Errorf("nats sink: connect: %w", err)
	}
	js, err := jetstream.New(nc,
		// Enough room for several concurrent calls of a large batch.
		jetstream.WithPublishAsyncMaxPending(16384),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
	)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats sink: %w", err)
	}
	return &Sink{nc: nc, js: js, format: f, subject: format.NameTemplate(o.SubjectTemplate, token), logger: logger, connErr: connErr}, nil
}

// awaitConnect gives a connection that is still making its first attempts
// (New returns at once: RetryOnFailedConnect) up to 2 s, or until ctx ends
// or an error is known, so the first Deliver reports the server's answer
// ("authorization violation") instead of a bare "not connected".
func (s *Sink) awaitConnect(ctx context.Context) nats.Status {
	deadline := time.Now().Add(2 * time.Second)
	for {
		st := s.nc.Status()
		switch {
		case st == nats.CONNECTED, st == nats.CLOSED,
			s.nc.LastError() != nil, s.connErr.Load() != nil,
			ctx.Err() != nil, time.Now().After(deadline):
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close drops the connection; Deliver has already waited for its acks.
func (s *Sink) Close() { s.nc.Close() }

// Deliver publishes every record and waits for each one's ack. If ctx ends
// first, the records not yet acknowledged get ctx's error and are retried;
// any of them the stream did store is dropped then as a duplicate.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	if st := s.awaitConnect(ctx); st != nats.CONNECTED {
		// Say why (e.g. "authorization violation") instead of letting each
		// publish fail with a buffer error.
		why := s.nc.LastError()
		if p := s.connErr.Load(); why == nil && p != nil {
			why = *p
		}
		err := fmt.Errorf("nats not connected (%s): %w", st, cmp.Or(why, nats.ErrConnectionClosed))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	spans := tracing.Start(ctx, "nats", recs)
	defer func() { spans.End(errs) }()
	futures := make([]jetstream.PubAckFuture, len(recs))
	subjects := make([]string, len(recs))
	stall := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		stall = max(time.Until(d), time.Millisecond)
	}
	for i, rec := range recs {
		body, subject, err := format.EncodeNamed(s.format, rec, s.subject)
		if err != nil {
			errs[i] = sink.Permanent(err)
			continue
		}
		subjects[i] = subject
		msg := &nats.Msg{Subject: subjects[i], Data: body, Header: headers(spans.Context(i), rec, s.format.ContentType())}
		futures[i], err = s.js.PublishMsgAsync(msg, jetstream.WithMsgID(rec.ID), jetstream.WithStallWait(stall))
		if err != nil {
			errs[i] = classify(subjects[i], err)
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = classify(subjects[i], err)
		case <-ctx.Done():
			// A slow ack is the server's pace, not the record's fault.
			errs[i] = sink.Overloaded(fmt.Errorf("nats publish to %q: no ack yet (not counted as a delivery attempt): %w", subjects[i], ctx.Err()))
		}
	}
	return errs
}

func headers(ctx context.Context, rec outbox.Record, contentType string) nats.Header {
	h := nats.Header{
		"ce_id":          {rec.ID},
		"ce_specversion": {format.CESpecVersion},
		"ce_type":        {format.CEType(rec)},
		"ce_source":      {format.CESource(rec)},
		"ce_subject":     {format.CESubject(rec)},
		"content-type":   {contentType},
	}
	if t := format.CETime(rec); t != "" {
		h["ce_time"] = []string{t}
	}
	for k, v := range tracing.Headers(ctx) {
		h[k] = []string{v}
	}
	return h
}

func classify(subject string, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// Retryable on purpose: a stream created after the pipe (a
		// deploy-order detail) must not turn into dead letters.
		return fmt.Errorf("no JetStream stream stores subject %q; create one "+
			"(nats stream add CDC --subjects %q, or add the subject to an existing stream); "+
			"the record stays pending and is retried: %w", subject, wildcard(subject), err)
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return sink.Overloaded(fmt.Errorf("nats publish to %q: server slow to acknowledge (not counted as a delivery attempt): %w", subject, err))
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject),
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return sink.Permanent(fmt.Errorf("nats refused the record for subject %q: %w", subject, err))
	default:
		return fmt.Errorf("nats publish to %q: %w", subject, err)
	}
}

// wildcard suggests a stream subject covering subject's siblings: its last
// token replaced by '*'.
func wildcard(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[:i] + ".*"
	}
	return subject
}

// token keeps a name one subject token: '.' separates tokens, '*' and '>'
// are wildcards and whitespace is not allowed in subjects.
func token(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, s)
}
