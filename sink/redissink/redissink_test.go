package redissink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cdcout/cdcout/internal/redistest"
	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

func newSink(t testing.TB, url string, edit func(*Options)) *Sink {
	t.Helper()
	o, err := ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func client(t testing.TB, srv *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: ""})
	t.Cleanup(func() { c.Close() })
	return c
}

func rec(k string, n int) outbox.Record { return sinktest.Record("redis", k, n) }

func noErrors(t testing.TB, errs []error) { t.Helper(); sinktest.NoErrors(t, errs) }

func TestDeliverAppendsRecordsWithTheirID(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := newSink(t, srv.URL("/cdc.{db}.{table}"), nil)
	recs := []outbox.Record{rec("a", 1), rec("b", 1), rec("a", 2)}
	other := rec("c", 1)
	other.Table = "orders"
	recs = append(recs, other)
	noErrors(t, s.Deliver(context.Background(), recs))

	c := client(t, srv)
	got, err := c.XRange(context.Background(), "cdc.shop.items", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("stream cdc.shop.items holds %d entries, want 3", len(got))
	}
	for i, m := range got {
		want := recs[i]
		for field, v := range map[string]string{
			"id": want.ID, "pipe": want.Pipe, "key": want.Key, "op": "c",
			"content-type": "application/json", "body": string(want.Payload),
		} {
			if m.Values[field] != v {
				t.Errorf("entry %d field %s = %v, want %q", i, field, m.Values[field], v)
			}
		}
	}
	if n, err := c.XLen(context.Background(), "cdc.shop.orders").Result(); err != nil || n != 1 {
		t.Fatalf("stream cdc.shop.orders holds %d entries (%v), want 1", n, err)
	}
}

func TestDefaultStreamAndMaxLen(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := newSink(t, srv.URL("?maxlen=10"), nil)
	for n := range 300 {
		noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", n)}))
	}
	n, err := client(t, srv).XLen(context.Background(), "cdcout.prod.shop.items").Result()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ trims whole macro nodes (100 entries by default).
	if n < 10 || n > 200 {
		t.Fatalf("stream holds %d entries after 300 appends with maxlen=10, want 10..200", n)
	}
}

func TestPasswordIsUsedAndNeverShown(t *testing.T) {
	const password = "s3cr3t-redis-pw"
	srv := redistest.Start(t, redistest.Options{Password: password})
	good := newSink(t, srv.URL("/s"), nil)
	noErrors(t, good.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))

	bad := newSink(t, "redis://:wrong-password-here@"+srv.Addr+"/s", nil)
	err := bad.Deliver(context.Background(), []outbox.Record{rec("a", 2)})[0]
	if err == nil {
		t.Fatal("deliver with a wrong password succeeded")
	}
	if sink.IsPermanent(err) {
		t.Errorf("auth failure is permanent (would dead-letter): %v", err)
	}
	if !strings.Contains(err.Error(), "credentials") {
		t.Errorf("error %q does not say the credentials are wrong", err)
	}
	if strings.Contains(err.Error(), "wrong-password-here") || strings.Contains(err.Error(), password) {
		t.Errorf("error shows the password: %v", err)
	}
}

func TestServerDownIsRetriedThenDelivered(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := newSink(t, srv.URL("/s"), nil)
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := s.Deliver(ctx, []outbox.Record{rec("a", 2)})[0]
	cancel()
	if err == nil || sink.IsPermanent(err) {
		t.Fatalf("deliver to a stopped server: %v, want a retryable error", err)
	}
	srv.Restart(t)
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 2)}))
	if n, err := client(t, srv).XLen(context.Background(), "s").Result(); err != nil || n != 1 {
		t.Fatalf("restarted (empty) server's stream holds %d (%v), want 1", n, err)
	}
}

func TestKeyOfAnotherTypeIsRetryable(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	if err := client(t, srv).Set(context.Background(), "taken", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, srv.URL("/taken"), nil)
	err := s.Deliver(context.Background(), []outbox.Record{rec("a", 1)})[0]
	if err == nil || sink.IsPermanent(err) || !strings.Contains(err.Error(), "is not a stream") {
		t.Fatalf("deliver to a string key: %v, want a retryable error saying the key is not a stream", err)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want Options
		err  string
	}{
		{url: "redis://h:7000/cdc.%7Bdb%7D.{table}", want: Options{Addr: "h:7000", StreamTemplate: "cdc.{db}.{table}"}},
		{url: "redis://h", want: Options{Addr: "h:6379"}},
		{url: "redis://u:p%40ss@h:1/s?db=2&maxlen=1000", want: Options{Addr: "h:1", Username: "u", Password: "p@ss", DB: 2, MaxLen: 1000, StreamTemplate: "s"}},
		{url: "rediss://:pw@h:1/s", want: Options{Addr: "h:1", Password: "pw", StreamTemplate: "s", TLS: &TLSOptions{}}},
		{url: "redis://:topsecret@/s", err: "no host"},
		{url: "redis://h/s?maxlen=-1", err: "maxlen"},
		{url: "redis://h/s?pool=3", err: `unknown parameter "pool"`},
		{url: "http://h/s", err: "want redis://"},
	} {
		got, err := ParseURL(tc.url)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "topsecret") {
				t.Errorf("ParseURL(%q) error = %v, want one saying %q (and no password)", tc.url, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseURL(%q): %v", tc.url, err)
			continue
		}
		if (got.TLS == nil) != (tc.want.TLS == nil) {
			t.Errorf("ParseURL(%q): TLS %v, want %v", tc.url, got.TLS != nil, tc.want.TLS != nil)
		}
		got.TLS, tc.want.TLS = nil, nil
		if got != tc.want {
			t.Errorf("ParseURL(%q) = %+v, want %+v", tc.url, got, tc.want)
		}
	}
}

// TestUnansweredXAddIsOverload: a server that does not answer within the
// attempt's timeout (writes paused) is overload, not an attempt.
func TestUnansweredXAddIsOverload(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := newSink(t, srv.URL("/s"), nil)
	noErrors(t, s.Deliver(context.Background(), []outbox.Record{rec("a", 1)}))
	if err := client(t, srv).Do(context.Background(), "CLIENT", "PAUSE", "2000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := s.Deliver(ctx, []outbox.Record{rec("a", 2)})[0]
	cancel()
	if err == nil || !sink.IsOverloaded(err) || sink.IsPermanent(err) {
		t.Fatalf("deliver to a paused server: %v, want an overload error", err)
	}
}
