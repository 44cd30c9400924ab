// Package pubsubsink delivers outbox records to Google Cloud Pub/Sub.
//
// Each record is one message: its data the record in the sink's format,
// its ordering key the row key (so a subscription with message ordering
// gets each row's changes in commit order), and its attributes the
// CloudEvents ones (ce_id = the delivery id, which consumers drop
// redeliveries by) plus the trace context. A record counts as delivered
// once Pub/Sub has acknowledged the publish. Credentials are the
// client's default ones (Application Default Credentials), and
// PUBSUB_EMULATOR_HOST points it at an emulator.
package pubsubsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/tracing"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// DefaultTopicTemplate names the topic when the URL has no path.
const DefaultTopicTemplate = "cdcout.{instance}.{db}.{table}"

// Options configure a Sink.
type Options struct {
	// Project is the Google Cloud project of the topics.
	Project string
	// TopicTemplate is expanded per record ({db}, {table}, {instance},
	// each mapped onto the topic-name alphabet). Default
	// DefaultTopicTemplate.
	TopicTemplate string
	// Format is the body format (format.New); default debezium.
	Format string
	// Timeout bounds the client's own retries of one publish (it retries
	// UNAVAILABLE, RESOURCE_EXHAUSTED and the like), and so how long Close
	// waits for publishes still pending; 0 means 10 s.
	Timeout time.Duration
}

// Sink publishes records to Pub/Sub topics. It is safe for concurrent
// Deliver calls.
type Sink struct {
	client  *pubsub.Client
	format  format.Format
	topic   func(outbox.Record) (string, error)
	timeout time.Duration

	mu         sync.Mutex
	publishers map[string]*pubsub.Publisher
}

var _ outbox.Sink = (*Sink)(nil)

// ParseURL reads "pubsub://project/topic-template".
func ParseURL(raw string) (Options, error) {
	rest, ok := strings.CutPrefix(raw, "pubsub://")
	project, tmpl, _ := strings.Cut(rest, "/")
	if !ok || project == "" {
		return Options{}, fmt.Errorf("pubsub url %q: want pubsub://project/topic-template", raw)
	}
	return Options{Project: project, TopicTemplate: format.UnescapeBraces(tmpl)}, nil
}

// New makes the client; it does not check that the topics exist (a topic
// created after the pipe is a deploy-order detail, retried).
func New(ctx context.Context, o Options) (*Sink, error) {
	f, err := format.New(o.Format)
	if err != nil {
		return nil, fmt.Errorf("pubsub sink: %w", err)
	}
	if o.TopicTemplate == "" {
		o.TopicTemplate = DefaultTopicTemplate
	}
	c, err := pubsub.NewClient(ctx, o.Project)
	if err != nil {
		return nil, fmt.Errorf("pubsub sink: %w", err)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	return &Sink{client: c, format: f, topic: format.NameTemplate(o.TopicTemplate, topicSafe),
		timeout: o.Timeout, publishers: map[string]*pubsub.Publisher{}}, nil
}

// Close stops the publishers and the client.
func (s *Sink) Close() {
	s.mu.Lock()
	for _, p := range s.publishers {
		p.Stop()
	}
	s.mu.Unlock()
	s.client.Close()
}

func (s *Sink) publisher(topic string) *pubsub.Publisher {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.publishers[topic]
	if p == nil {
		p = s.client.Publisher(topic)
		p.EnableMessageOrdering = true
		p.PublishSettings.Timeout = s.timeout
		s.publishers[topic] = p
	}
	return p
}

// Deliver publishes every record and waits for each acknowledgement.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	spans := tracing.Start(ctx, "pubsub", recs)
	defer func() { spans.End(errs) }()
	results := make([]*pubsub.PublishResult, len(recs))
	topics := make([]string, len(recs))
	keys := make([]string, len(recs))
	for i, rec := range recs {
		body, topic, err := format.EncodeNamed(s.format, rec, s.topic)
		if err != nil {
			errs[i] = sink.Permanent(err)
			continue
		}
		topics[i] = topic
		// A keyless table's records have no row order to keep.
		if rec.Key != "" && rec.Key != "null" {
			keys[i] = rec.Key
		}
		attrs := format.CEAttributes(rec, s.format.ContentType())
		for k, v := range tracing.Headers(spans.Context(i)) {
			attrs[k] = v
		}
		results[i] = s.publisher(topics[i]).Publish(spans.Context(i), &pubsub.Message{Data: body, Attributes: attrs, OrderingKey: keys[i]})
	}
	for i, r := range results {
		if r == nil {
			continue
		}
		if _, err := r.Get(ctx); err != nil {
			errs[i] = classify(ctx, topics[i], err)
			if keys[i] != "" {
				// A failed publish pauses its ordering key until resumed;
				// the drainer's retry must find it open.
				s.publisher(topics[i]).ResumePublish(keys[i])
			}
		}
	}
	return errs
}

func classify(ctx context.Context, topic string, err error) error {
	switch status.Code(err) {
	case codes.NotFound:
		// Retryable on purpose, like a missing NATS stream.
		return fmt.Errorf("pubsub topic %q does not exist; create it (gcloud pubsub topics create %s); "+
			"the record stays pending and is retried: %w", topic, topic, err)
	case codes.InvalidArgument:
		return sink.Permanent(fmt.Errorf("pubsub refused the record for topic %q: %w", topic, err))
	case codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("pubsub refused the sink's credentials for topic %q (retried): %w", topic, err)
	case codes.ResourceExhausted, codes.Unavailable, codes.DeadlineExceeded:
		return sink.Overloaded(fmt.Errorf("pubsub publish to %q: server busy (not counted as a delivery attempt): %w", topic, err))
	}
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return sink.Overloaded(fmt.Errorf("pubsub publish to %q: no acknowledgement yet (not counted as a delivery attempt): %w", topic, err))
	}
	return fmt.Errorf("pubsub publish to %q: %w", topic, err)
}

// topicSafe maps a name onto the topic-name alphabet [A-Za-z0-9-_.~+%].
func topicSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("-_.~+", r):
			return r
		}
		return '_'
	}, s)
}
