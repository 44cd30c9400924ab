package natssink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// runServer starts an embedded JetStream server on a random port.
func runServer(t testing.TB, edit func(*server.Options)) *server.Server {
	t.Helper()
	return sinktest.RunNATS(t, edit)
}

// addStream creates a stream and returns a handle to inspect it.
func addStream(t testing.TB, url string, cfg jetstream.StreamConfig, connOpts ...nats.Option) jetstream.Stream {
	t.Helper()
	return sinktest.AddStream(t, url, cfg, connOpts...)
}

func newSink(t testing.TB, o Options) *Sink {
	t.Helper()
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func rec(k string, n int) outbox.Record { return sinktest.Record("nats", k, n) }

func noErrors(t testing.TB, errs []error) { t.Helper(); sinktest.NoErrors(t, errs) }

func msgs(t *testing.T, st jetstream.Stream) uint64 {
	t.Helper()
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestDeliverStoresRecordsWithHeaders(t *testing.T) {
	srv := runServer(t, nil)
	st := addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := newSink(t, Options{URL: srv.ClientURL()})
	recs := []outbox.Record{rec("a", 1), rec("b", 1), rec("c", 1)}
	noErrors(t, s.Deliver(context.Background(), recs))
	if got, want := msgs(t, st), uint64(3); got != want {
		t.Fatalf("stream holds %d messages, want %d", got, want)
	}
	m, err := st.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Subject, "cdcout.prod.shop.items"; got != want {
		t.Fatalf("subject = %q, want %q", got, want)
	}
	var r outbox.Record
	for _, c := range recs {
		if string(c.Payload) == string(m.Data) {
			r = c
		}
	}
	if r.ID == "" {
		t.Fatalf("stored data %s is none of the payloads", m.Data)
	}
	for h, want := range map[string]string{
		"Nats-Msg-Id":    r.ID,
		"ce_id":          r.ID,
		"ce_specversion": "1.0",
		"ce_type":        "cdcout.change.c",
		"ce_source":      "cdcout/prod",
		"ce_subject":     "shop.items",
		"ce_time":        "2026-11-29T12:00:00Z",
		"content-type":   "application/json",
	} {
		if got := m.Header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
}

func TestRedeliveryIsStoredOnce(t *testing.T) {
	srv := runServer(t, nil)
	st := addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := newSink(t, Options{URL: srv.ClientURL()})
	r := rec("a", 1)
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{r}))
	// The drainer's retry after a lost ack, and another replica's
	// delivery of the same outbox row, both carry the same deliveryKey.
	r.Attempt = 2
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{r}))
	other := newSink(t, Options{URL: srv.ClientURL()})
	noErrors(t, other.Deliver(context.Background(), []outbox.Record{r, rec("b", 1)}))
	if got, want := msgs(t, st), uint64(2); got != want {
		t.Fatalf("stream holds %d messages, want %d: a redelivery was stored again", got, want)
	}
}

func TestMissingStreamIsRetryableAndClear(t *testing.T) {
	srv := runServer(t, nil)
	s := newSink(t, Options{URL: srv.ClientURL(), SubjectTemplate: "cdc.{db}.{table}"})
	err := s.Deliver(context.Background(), []outbox.Record{rec("a", 1)})[0]
	if err == nil || sink.IsPermanent(err) {
		t.Fatalf("no stream: %v, want a retryable error", err)
	}
	for _, want := range []string{`"cdc.shop.items"`, "no JetStream stream", `nats stream add CDC --subjects "cdc.shop.*"`} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("missing-stream error %q does not mention %q", err, want)
		}
	}
	// A stream created late loses nothing: the retry goes through.
	st := addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))
	if got, want := msgs(t, st), uint64(1); got != want {
		t.Fatalf("stream holds %d messages, want %d", got, want)
	}
}

func TestPerKeyOrderWithConcurrentCalls(t *testing.T) {
	srv := runServer(t, nil)
	st := addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := newSink(t, Options{URL: srv.ClientURL()})
	// Like the drainer: concurrent calls never share a key, and a key's
	// next record goes out only after the previous one was acknowledged.
	const workers, keysPer, rounds = 6, 5, 30
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for n := 1; n <= rounds; n++ {
				var call []outbox.Record
				for k := range keysPer {
					call = append(call, rec(fmt.Sprintf("w%dk%d", w, k), n))
				}
				for i, err := range s.Deliver(context.Background(), call) {
					if err != nil {
						errc <- fmt.Errorf("worker %d round %d record %d: %w", w, n, i, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	total := workers * keysPer * rounds
	if got := msgs(t, st); got != uint64(total) {
		t.Fatalf("stream holds %d messages, want %d", got, total)
	}
	next := map[string]int{}
	for seq := uint64(1); seq <= uint64(total); seq++ {
		m, err := st.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		var key string
		var n int
		if _, err := fmt.Sscanf(string(m.Data[strings.Index(string(m.Data), `"key":`):]), `"key":%q,"seq":%d}`, &key, &n); err != nil {
			t.Fatalf("%s: %v", m.Data, err)
		}
		next[key]++
		if n != next[key] {
			t.Fatalf("stream seq %d: key %s record %d, want %d", seq, key, n, next[key])
		}
	}
}

func TestTooLargeIsPermanent(t *testing.T) {
	srv := runServer(t, func(o *server.Options) { o.MaxPayload = 4096 })
	addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}, MaxMsgSize: 1024})
	s := newSink(t, Options{URL: srv.ClientURL()})
	big := func(n int) outbox.Record {
		r := rec("big", n)
		r.Payload = fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("x", n))
		return r
	}
	errs := s.Deliver(context.Background(), []outbox.Record{big(2048), big(8192), rec("small", 1)})
	for i, what := range []string{"over the stream's max_msg_size", "over the server's max_payload"} {
		if !sink.IsPermanent(errs[i]) {
			t.Errorf("record %s: %v, want permanent", what, errs[i])
		}
	}
	if errs[2] != nil {
		t.Fatalf("small record: %v", errs[2])
	}
}

func TestAuthOptions(t *testing.T) {
	t.Run("token", func(t *testing.T) {
		srv := runServer(t, func(o *server.Options) { o.Authorization = "s3cret-token" })
		addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}}, nats.Token("s3cret-token"))
		s := newSink(t, Options{URL: srv.ClientURL(), Token: "s3cret-token"})
		noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))
	})
	t.Run("user", func(t *testing.T) {
		srv := runServer(t, func(o *server.Options) { o.Username, o.Password = "cdc", "s3cret-pass" })
		addStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}}, nats.UserInfo("cdc", "s3cret-pass"))
		s := newSink(t, Options{URL: srv.ClientURL(), User: "cdc", Password: "s3cret-pass"})
		noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		bad, err := New(ctx, Options{URL: srv.ClientURL(), User: "cdc", Password: "wrong-pass"})
		if err == nil {
			defer bad.Close()
			err = bad.Deliver(ctx, []outbox.Record{rec("a", 2)})[0]
		}
		if err == nil {
			t.Fatal("wrong password: delivered")
		}
		if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("wrong password: %v, want it to say why", err)
		}
		if strings.Contains(err.Error(), "wrong-pass") {
			t.Fatalf("error shows the password: %v", err)
		}
	})
}

func TestSubjectTemplate(t *testing.T) {
	r := rec("a", 1)
	r.Pipe = "eu.prod:shop.items:nats"
	r.Table = "order items>"
	if got, err := format.NameTemplate(DefaultSubjectTemplate, token)(r); err != nil || got != "cdcout.eu_prod.shop.order_items_" {
		t.Fatalf("subject = %q, %v; want %q", got, err, "cdcout.eu_prod.shop.order_items_")
	}
}

func TestParseURL(t *testing.T) {
	u, tmpl, err := ParseURL("nats://n1:4222,n2:4222/cdc.%7Bdb%7D.{table}")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := u, "nats://n1:4222,nats://n2:4222"; got != want {
		t.Fatalf("url = %q, want %q", got, want)
	}
	if got, want := tmpl, "cdc.{db}.{table}"; got != want {
		t.Fatalf("template = %q, want %q", got, want)
	}
	for _, bad := range []string{"kafka://n1/x", "nats:///x"} {
		if _, _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) succeeded", bad)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no url": {},
		"format": {URL: "nats://127.0.0.1:1", Format: "avro"},
		"tls":    {URL: "nats://127.0.0.1:1", TLS: &TLSOptions{CAFile: "/nonexistent/ca.pem"}},
	} {
		if _, err := New(context.Background(), o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if err := classify("x", errors.New("boom")); sink.IsPermanent(err) || sink.IsOverloaded(err) {
		t.Fatalf("unknown error classified permanent or overloaded: %v", err)
	}
	// A server slow to acknowledge is overload: retried without counting
	// an attempt.
	if err := classify("x", nats.ErrTimeout); !sink.IsOverloaded(err) || sink.IsPermanent(err) {
		t.Fatalf("ack timeout: %v, want overloaded", err)
	}
}
