package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newSink(t testing.TB, c *kfake.Cluster, o Options) *Sink {
	t.Helper()
	o.Brokers = c.ListenAddrs()
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// rec is an update of key k carrying seq n (sinktest.Record).
func rec(k string, n int) outbox.Record {
	r := sinktest.Record("kafka", k, n)
	r.Op = canonical.OpUpdate
	return r
}

// consume reads n records of topic from the start, failing after a deadline.
func consume(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	return sinktest.ConsumeKafka(t, c, 10*time.Second, n, topic)
}

func noErrors(t *testing.T, errs []error) { t.Helper(); sinktest.NoErrors(t, errs) }

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// checkOrder asserts every key's records sit in one partition with seqs
// 1..n in offset order, and returns how many partitions were used.
func checkOrder(t *testing.T, got []*kgo.Record, keys []string, n int) int {
	t.Helper()
	partOf := map[string]int32{}
	next := map[string]int{}
	parts := map[int32]bool{}
	for _, r := range got {
		k := string(r.Key)
		if p, ok := partOf[k]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", k, p, r.Partition)
		}
		partOf[k] = r.Partition
		parts[r.Partition] = true
		next[k]++
		if want := fmt.Sprintf(`"seq":%d}`, next[k]); !strings.HasSuffix(string(r.Value), want) {
			t.Fatalf("key %s: record %d is %s, want seq %d", k, next[k], r.Value, next[k])
		}
	}
	for _, k := range keys {
		if got := next[fmt.Sprintf(`{"id":%q}`, k)]; got != n {
			t.Fatalf("key %s: %d records, want %d", k, got, n)
		}
	}
	return len(parts)
}

func TestDeliverKeysHeadersOrder(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "prod.shop.items"))
	s := newSink(t, c, Options{})
	keys := []string{"a", "b", "c", "d", "e", "f"}
	const rounds = 10
	for n := 1; n <= rounds; n++ {
		var call []outbox.Record
		for _, k := range keys {
			call = append(call, rec(k, n))
		}
		noErrors(t, s.Deliver(context.Background(), call))
	}
	got := consume(t, c, "prod.shop.items", len(keys)*rounds)
	if parts := checkOrder(t, got, keys, rounds); parts < 2 {
		t.Fatalf("all keys in %d partition; the test needs several to mean anything", parts)
	}
	r := got[0]
	for h, want := range map[string]string{
		"ce_specversion": "1.0",
		"ce_type":        "cdcout.change.u",
		"ce_source":      "cdcout/prod",
		"ce_subject":     "shop.items",
		"ce_time":        "2026-11-29T12:00:00Z",
		"content-type":   "application/json",
	} {
		if got := header(r, h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if id := header(r, "ce_id"); !strings.Contains(string(r.Value), `"id":"`+id+`"`) {
		t.Errorf("ce_id %q is not the record's id (value %s)", id, r.Value)
	}
}

// failProduce answers a produce request with code for every partition.
func failProduce(req kmsg.Request, code int16) kmsg.Response {
	pr := req.(*kmsg.ProduceRequest)
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range pr.Topics {
		t := kmsg.NewProduceResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			p := kmsg.NewProduceResponseTopicPartition()
			p.Partition = rp.Partition
			p.ErrorCode = code
			p.BaseOffset = -1
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	return resp
}

func TestRetriableErrorIsRetriedInOrder(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "prod.shop.items"))
	// franz-go retries after a metadata refresh, at most every 5s by default.
	s := newSink(t, c, Options{RecordRetries: 2, kgoOpts: []kgo.Opt{kgo.MetadataMinAge(20 * time.Millisecond)}})
	keys := []string{"a", "b", "c", "d"}
	call := func(n int) []outbox.Record {
		var recs []outbox.Record
		for _, k := range keys {
			recs = append(recs, rec(k, n))
		}
		return recs
	}
	noErrors(t, s.Deliver(context.Background(), call(1)))

	var failing atomic.Bool
	var failed atomic.Int32
	failing.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		failed.Add(1)
		return failProduce(req, kerr.NotEnoughReplicas.Code), nil, true
	})
	errs := s.Deliver(context.Background(), call(2))
	for i, err := range errs {
		if err == nil {
			t.Fatalf("record %d delivered while the broker refused every produce", i)
		}
		if sink.IsPermanent(err) {
			t.Fatalf("record %d: retriable broker error came back permanent: %v", i, err)
		}
		if !errors.Is(err, kerr.NotEnoughReplicas) {
			t.Fatalf("record %d: %v, want NOT_ENOUGH_REPLICAS", i, err)
		}
	}
	if failed.Load() < 2 {
		t.Fatalf("broker saw %d failing produce requests; franz-go should retry before giving up", failed.Load())
	}

	// The drainer retries the same records; then the keys move on.
	failing.Store(false)
	noErrors(t, s.Deliver(context.Background(), call(2)))
	noErrors(t, s.Deliver(context.Background(), call(3)))
	checkOrder(t, consume(t, c, "prod.shop.items", 3*len(keys)), keys, 3)
}

func TestTooLargeIsPermanent(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "prod.shop.items"))

	t.Run("client side", func(t *testing.T) {
		s := newSink(t, c, Options{MaxMessageBytes: 1024})
		big := rec("big", 1)
		big.Payload = fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("x", 4096))
		errs := s.Deliver(context.Background(), []outbox.Record{big, rec("small", 1)})
		if !sink.IsPermanent(errs[0]) || !errors.Is(errs[0], kerr.MessageTooLarge) {
			t.Fatalf("oversized record: %v, want a permanent MESSAGE_TOO_LARGE", errs[0])
		}
		if errs[1] != nil {
			t.Fatalf("small record next to it: %v", errs[1])
		}
	})

	t.Run("broker", func(t *testing.T) {
		s := newSink(t, c, Options{})
		c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			return failProduce(req, kerr.MessageTooLarge.Code), nil, true
		})
		errs := s.Deliver(context.Background(), []outbox.Record{rec("a", 1)})
		if !sink.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), `"prod.shop.items"`) {
			t.Fatalf("broker MESSAGE_TOO_LARGE: %v, want permanent naming the topic", errs[0])
		}
	})
}

func TestMissingTopicIsRetryableAndClear(t *testing.T) {
	c := newCluster(t) // no topics, no auto-creation
	s := newSink(t, c, Options{TopicTemplate: "cdc.{db}.{table}"})
	errs := s.Deliver(context.Background(), []outbox.Record{rec("a", 1)})
	err := errs[0]
	if err == nil || sink.IsPermanent(err) {
		t.Fatalf("missing topic: %v, want a retryable error", err)
	}
	for _, want := range []string{`"cdc.shop.items"`, "does not exist", "kafka-topics.sh --create"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("missing-topic error %q does not mention %q", err, want)
		}
	}

	// Creating the topic late loses nothing: the retry goes through.
	adm := kadm.NewClient(s.client)
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, "cdc.shop.items"); err != nil {
		t.Fatal(err)
	}
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))
	if got := consume(t, c, "cdc.shop.items", 1); string(got[0].Key) != `{"id":"a"}` {
		t.Fatalf("key = %s", got[0].Key)
	}
}

func TestTopicTemplate(t *testing.T) {
	r := rec("a", 1)
	r.Pipe = "eu/prod:shop.items:kafka"
	r.Table = "order items"
	if got, err := format.NameTemplate("{instance}.{db}.{table}", topicSafe)(r); err != nil || got != "eu_prod.shop.order_items" {
		t.Fatalf("topic = %q, %v; want %q", got, err, "eu_prod.shop.order_items")
	}
	if got, err := format.NameTemplate("all-changes", topicSafe)(r); err != nil || got != "all-changes" {
		t.Fatalf("topic = %q, %v; want all-changes", got, err)
	}
}

func TestParseURL(t *testing.T) {
	brokers, tmpl, err := ParseURL("kafka://k1:9092,k2/cdc.%7Bdb%7D.{table}")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(brokers, ","), "k1:9092,k2:9092"; got != want {
		t.Fatalf("brokers = %s, want %s", got, want)
	}
	if got, want := tmpl, "cdc.{db}.{table}"; got != want {
		t.Fatalf("template = %q, want %q", got, want)
	}
	for _, bad := range []string{"http://k1/x", "kafka:///topic"} {
		if _, _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) succeeded", bad)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no brokers":  {},
		"format":      {Brokers: []string{"k:9092"}, Format: "avro"},
		"sasl":        {Brokers: []string{"k:9092"}, SASL: &SASLOptions{Mechanism: "GSSAPI"}},
		"tls ca file": {Brokers: []string{"k:9092"}, TLS: &TLSOptions{CAFile: "/nonexistent/ca.pem"}},
	} {
		if _, err := New(context.Background(), o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func TestSASL(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			c := newCluster(t, kfake.EnableSASL(), kfake.Superuser(mech, "cdc", "s3cret"),
				kfake.SeedTopics(1, "prod.shop.items"))
			s := newSink(t, c, Options{SASL: &SASLOptions{Mechanism: mech, Username: "cdc", Password: "s3cret"}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			noErrors(t, s.Deliver(ctx, []outbox.Record{rec("a", 1)}))
		})
	}
}

func TestTransientErrorsAreRetriedWithinDeliver(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "prod.shop.items"))
	s := newSink(t, c, Options{kgoOpts: []kgo.Opt{kgo.MetadataMinAge(20 * time.Millisecond)}})
	var failed atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if failed.Add(1) > 3 {
			c.DropControl()
			return nil, nil, false
		}
		return failProduce(req, kerr.NotLeaderForPartition.Code), nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	noErrors(t, s.Deliver(ctx, []outbox.Record{rec("a", 1)}))
	noErrors(t, s.Deliver(ctx, []outbox.Record{rec("a", 2)}))
	checkOrder(t, consume(t, c, "prod.shop.items", 2), []string{"a"}, 2)
	if got := failed.Load(); got < 4 {
		t.Fatalf("broker failed %d produce requests, want the first 3 refused and retried", got)
	}
}

// Broker throttling and slow acks are overload (retried without counting
// an attempt), a record the broker refuses is permanent, anything else a
// plain retry.
func TestClassifyOverload(t *testing.T) {
	for _, tc := range []struct {
		err                   error
		overloaded, permanent bool
	}{
		{kerr.ThrottlingQuotaExceeded, true, false},
		{kerr.RequestTimedOut, true, false},
		{fmt.Errorf("produce: %w", context.DeadlineExceeded), true, false},
		{kgo.ErrRecordTimeout, true, false},
		{kerr.MessageTooLarge, false, true},
		{errors.New("broken pipe"), false, false},
	} {
		err := classify("t", tc.err)
		if sink.IsOverloaded(err) != tc.overloaded || sink.IsPermanent(err) != tc.permanent {
			t.Errorf("classify(%v) = %v: overloaded %v, permanent %v; want %v, %v",
				tc.err, err, sink.IsOverloaded(err), sink.IsPermanent(err), tc.overloaded, tc.permanent)
		}
	}
}

// The headers carry the CloudEvents attributes exactly as the format
// package computes them (cloudevents format, NATS and webhook headers).
func TestHeadersMatchFormat(t *testing.T) {
	rec := outbox.Record{ID: "01HX-id", Pipe: "inst:shop.orders:kafka", DB: "shop", Table: "orders", Op: "u",
		CommitTime: time.Date(2026, 12, 1, 14, 30, 0, 123456000, time.FixedZone("x", 3600))}
	for _, tc := range []struct {
		rec  outbox.Record
		want map[string]string
	}{
		{rec, map[string]string{"ce_id": rec.ID, "ce_specversion": format.CESpecVersion, "ce_type": format.CEType(rec),
			"ce_source": format.CESource(rec), "ce_subject": format.CESubject(rec), "content-type": "application/json",
			"ce_time": format.CETime(rec)}},
		{outbox.Record{ID: "tx", Pipe: "inst:__cdcout.transaction:kafka", DB: "__cdcout", Table: "transaction", Op: canonical.OpTransaction},
			map[string]string{"ce_id": "tx", "ce_specversion": format.CESpecVersion, "ce_type": "cdcout.transaction",
				"ce_source": "cdcout/inst", "ce_subject": "__cdcout.transaction", "content-type": "application/json"}},
		{outbox.Record{ID: "x", Pipe: "p", DB: "d", Table: "t", Op: "c"}, map[string]string{"ce_id": "x",
			"ce_specversion": format.CESpecVersion, "ce_type": "cdcout.change.c", "ce_source": "cdcout/p", "ce_subject": "d.t",
			"content-type": "application/json"}},
	} {
		got := map[string]string{}
		for _, h := range headers(context.Background(), tc.rec, "application/json") {
			got[h.Key] = string(h.Value)
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("headers of %+v:\n got %v\nwant %v", tc.rec, got, tc.want)
		}
	}
}
