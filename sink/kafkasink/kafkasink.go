// Package kafkasink delivers outbox records to Apache Kafka with franz-go.
//
// The producer is idempotent with acks=all, so the broker drops the
// duplicates its own retries would create, and every record is keyed by the
// canonical JSON of its row key: Kafka's default (murmur2) partitioner then
// puts all changes of one row into one partition, and the drainer, which
// never hands out a key's next record before the previous one is
// delivered, keeps them in commit order there.
package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/tracing"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// DefaultTopicTemplate names the topic when the URL has no path, in
// Debezium's "<prefix>.<db>.<table>" style.
const DefaultTopicTemplate = "{instance}.{db}.{table}"

// TLSOptions enables TLS; see sink.TLSOptions.
type TLSOptions = sink.TLSOptions

// SASLOptions authenticates to the brokers.
type SASLOptions struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string
	Username  string
	Password  string
}

// Options configure a Sink. Brokers is required; the rest has defaults.
type Options struct {
	Brokers []string
	// TopicTemplate is expanded per record: {db}, {table} and {instance}
	// are replaced by the record's values, with characters Kafka does not
	// allow in topic names turned into '_'. Default DefaultTopicTemplate.
	TopicTemplate string
	// Format is the message body format (format.New); default debezium.
	Format   string
	ClientID string // default "cdcout"
	TLS      *TLSOptions
	SASL     *SASLOptions
	// Linger is how long a partition waits for more records before a
	// produce request is sent. Default 0: every Deliver call waits for its
	// records' acknowledgements, so a linger is added to every call, while
	// records produced during a request in flight (up to five a broker)
	// batch anyway. At 5 ms a 1,000-record segment, delivered in two
	// rounds of calls, took 14 ms to kfake, and the drain, not the read,
	// bounded BenchmarkKafkaEndToEnd (58k changes/s narrow; 96k at 0).
	Linger time.Duration
	// MaxMessageBytes caps a record batch (and so a record) before
	// compression; it must not exceed the topics' max.message.bytes, or a
	// full batch of small records could be refused as too large. Default
	// 1,000,000 (Kafka's default is 1,048,588).
	MaxMessageBytes int32
	// RecordRetries bounds franz-go's own retries of a retriable produce
	// error within one Deliver; when they run out the records are
	// returned as retryable errors and the drainer retries them with
	// backoff. 0 means unbounded: the attempt's context bounds them.
	RecordRetries int
	// AutoCreateTopics asks the broker to create missing topics (the
	// broker must also allow it: auto.create.topics.enable).
	AutoCreateTopics bool
	Logger           *zap.Logger

	kgoOpts []kgo.Opt // tests: e.g. a short metadata age so retries are quick
}

// Sink produces records to Kafka. It is safe for concurrent Deliver calls.
type Sink struct {
	client *kgo.Client
	format format.Format
	topic  func(outbox.Record) (string, error)
	logger *zap.Logger
}

var _ outbox.Sink = (*Sink)(nil)

// ParseURL splits "kafka://broker1:9092,broker2:9092/topic-template" into
// its brokers and topic template ("" when the URL has no path). Template
// braces may be written literally or percent-encoded.
func ParseURL(raw string) (brokers []string, topicTemplate string, err error) {
	rest, ok := strings.CutPrefix(raw, "kafka://")
	if !ok {
		return nil, "", fmt.Errorf("kafka url %q: want kafka://host:port[,host:port…]/topic-template", raw)
	}
	hosts, tmpl, _ := strings.Cut(rest, "/")
	tmpl = format.UnescapeBraces(tmpl)
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if !strings.Contains(h, ":") {
			h += ":9092"
		}
		brokers = append(brokers, h)
	}
	if len(brokers) == 0 {
		return nil, "", fmt.Errorf("kafka url %q: no brokers", raw)
	}
	return brokers, tmpl, nil
}

// New returns a Sink. It does not wait for the brokers: an unreachable
// cluster makes deliveries fail and retry, it does not stop the service.
func New(ctx context.Context, o Options) (*Sink, error) {
	if len(o.Brokers) == 0 {
		return nil, errors.New("kafka sink: no brokers")
	}
	f, err := format.New(o.Format)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	logger := o.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	logger = logger.Named("kafkasink")
	if o.TopicTemplate == "" {
		o.TopicTemplate = DefaultTopicTemplate
	}
	if o.ClientID == "" {
		o.ClientID = "cdcout"
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = 1_000_000
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(o.Brokers...),
		kgo.ClientID(o.ClientID),
		// Idempotence is franz-go's default and requires acks=all; say
		// both so neither can be lost to a future default change.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(o.Linger),
		kgo.ProducerBatchMaxBytes(o.MaxMessageBytes),
		kgo.ProducerBatchCompression(kgo.SnappyCompression(), kgo.NoCompression()),
		kgo.MaxBufferedRecords(100_000),
		kgo.WithLogger(zapLogger{logger}),
	}
	if o.RecordRetries > 0 {
		opts = append(opts, kgo.RecordRetries(o.RecordRetries))
	}
	if o.AutoCreateTopics {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	if o.TLS != nil {
		tc, err := o.TLS.Config()
		if err != nil {
			return nil, fmt.Errorf("kafka sink: %w", err)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if o.SASL != nil {
		mech, err := saslMechanism(o.SASL)
		if err != nil {
			return nil, fmt.Errorf("kafka sink: %w", err)
		}
		opts = append(opts, kgo.SASL(mech))
	}
	cl, err := kgo.NewClient(append(opts, o.kgoOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	return &Sink{client: cl, format: f, topic: format.NameTemplate(o.TopicTemplate, topicSafe), logger: logger}, nil
}

// Close flushes nothing (Deliver waits for its records) and closes the
// client's connections.
func (s *Sink) Close() { s.client.Close() }

// Ping checks that a broker answers, for readiness checks.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx); err != nil {
		return fmt.Errorf("kafka ping: %w", err)
	}
	return nil
}

// Deliver produces all records at once (franz-go batches them per
// partition) and waits for every result. ctx bounds the wait for records not
// yet sent; a record already in flight is waited for, because giving up on it
// would break the idempotent producer's sequence.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	spans := tracing.Start(ctx, "kafka", recs)
	defer func() { spans.End(errs) }()
	var wg sync.WaitGroup
	// The records in one allocation: the client is done with each once
	// its promise ran, and Deliver returns only after every promise.
	krs := make([]kgo.Record, len(recs))
	for i, rec := range recs {
		value, topic, err := format.EncodeNamed(s.format, rec, s.topic)
		if err != nil {
			errs[i] = sink.Permanent(err)
			continue
		}
		kr := &krs[i]
		kr.Topic, kr.Value = topic, value
		kr.Headers = headers(spans.Context(i), rec, s.format.ContentType())
		// A keyless table's records ("null") have no row identity to keep
		// together; letting them spread avoids one hot partition.
		if rec.Key != "" && rec.Key != "null" {
			kr.Key = []byte(rec.Key)
		}
		wg.Add(1)
		s.client.Produce(ctx, kr, func(_ *kgo.Record, err error) {
			errs[i] = classify(topic, err)
			wg.Done()
		})
	}
	wg.Wait()
	return errs
}

// headers are a record's CloudEvents headers. Their values share one
// buffer, sized up front and written by the format package's Append*
// forms: built one []byte per value they were 7 % of the sink's CPU in
// BenchmarkKafkaEndToEnd.
func headers(ctx context.Context, rec outbox.Record, contentType string) []kgo.RecordHeader {
	buf := make([]byte, 0, len(rec.ID)+len(format.CESpecVersion)+len("cdcout.transaction")+len(rec.Op)+
		len("cdcout/")+len(rec.Pipe)+len(rec.DB)+1+len(rec.Table)+len(contentType)+len(time.RFC3339Nano))
	h := make([]kgo.RecordHeader, 0, 8)
	add := func(key string, start int) {
		h = append(h, kgo.RecordHeader{Key: key, Value: buf[start:len(buf):len(buf)]})
	}
	start := len(buf)
	buf = append(buf, rec.ID...)
	add("ce_id", start)
	start = len(buf)
	buf = append(buf, format.CESpecVersion...)
	add("ce_specversion", start)
	start = len(buf)
	buf = format.AppendCEType(buf, rec)
	add("ce_type", start)
	start = len(buf)
	buf = format.AppendCESource(buf, rec)
	add("ce_source", start)
	start = len(buf)
	buf = format.AppendCESubject(buf, rec)
	add("ce_subject", start)
	start = len(buf)
	buf = append(buf, contentType...)
	add("content-type", start)
	if start = len(buf); !rec.CommitTime.IsZero() {
		buf = format.AppendCETime(buf, rec)
		add("ce_time", start)
	}
	for k, v := range tracing.Headers(ctx) {
		h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return h
}

// permanentErrors are broker answers no retry can change: the record (or
// its topic name) is unacceptable, or the sink may not write the topic. They
// dead-letter the record with the broker's reason.
var permanentErrors = []error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidRecord,
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.PolicyViolation,
	kerr.InvalidTimestamp,
	kerr.UnsupportedForMessageFormat,
}

func classify(topic string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		// Retryable on purpose: a topic created after the pipe (a
		// deploy-order detail) must not turn into dead letters.
		return fmt.Errorf("kafka topic %q does not exist; create it (kafka-topics.sh --create --topic %s) "+
			"or enable auto.create.topics.enable on the brokers and auto_create_topics on the sink; "+
			"the record stays pending and is retried: %w", topic, topic, err)
	}
	for _, p := range permanentErrors {
		if errors.Is(err, p) {
			return sink.Permanent(fmt.Errorf("kafka refused the record for topic %q: %w", topic, err))
		}
	}
	for _, o := range overloadErrors {
		if errors.Is(err, o) {
			return sink.Overloaded(fmt.Errorf("kafka is slow or throttling (not counted as a delivery attempt) for topic %q: %w", topic, err))
		}
	}
	return fmt.Errorf("kafka produce to topic %q: %w", topic, err)
}

// overloadErrors are a broker that throttles or acknowledges too slowly
// (the attempt's deadline passed waiting for acks=all): not the record's
// fault, so the record is retried without counting an attempt and never
// dead-lettered for it.
var overloadErrors = []error{
	kerr.ThrottlingQuotaExceeded,
	kerr.RequestTimedOut,
	kerr.NotEnoughReplicas,
	kerr.NotEnoughReplicasAfterAppend,
	kgo.ErrRecordTimeout,
	context.DeadlineExceeded,
}

// topicSafe maps a name onto Kafka's topic alphabet [a-zA-Z0-9._-].
func topicSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, s)
}

func saslMechanism(o *SASLOptions) (kgoSASL, error) {
	switch strings.ToUpper(o.Mechanism) {
	case "PLAIN":
		return plain.Auth{User: o.Username, Pass: o.Password}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: o.Username, Pass: o.Password}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: o.Username, Pass: o.Password}.AsSha512Mechanism(), nil
	default:
		return nil, fmt.Errorf("sasl mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", o.Mechanism)
	}
}
