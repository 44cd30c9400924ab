package httpsink

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

type seen struct {
	header http.Header
	body   string
}

func recorder(t *testing.T, status func(n int64, r *http.Request) (int, http.Header, string)) (*httptest.Server, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Header.Clone(), string(b)})
		mu.Unlock()
		code, h, body := 200, http.Header(nil), ""
		if status != nil {
			code, h, body = status(n.Add(1), r)
		}
		for k, v := range h {
			w.Header()[k] = v
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen { mu.Lock(); defer mu.Unlock(); return append([]seen(nil), got...) }
}

func rec(id string, payload string) outbox.Record {
	return outbox.Record{
		ID: id, Pipe: "prod:shop.orders:hook", Sink: "hook", DB: "shop", Table: "orders",
		Op: "u", Key: `{"id":1}`, Payload: []byte(payload), Attempt: 1,
		CommitTime: time.Date(2026, 11, 29, 12, 0, 0, 500000000, time.UTC),
	}
}

// TestStandardWebhooksReference checks the signature against the Standard
// Webhooks reference test vector (the spec's libraries' test suite), and
// against the algorithm recomputed here from the spec's text.
func TestStandardWebhooksReference(t *testing.T) {
	const (
		secret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		msgID   = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts      = 1614265330
		payload = `{"test": 2432232314}`
		want    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	srv, got := recorder(t, nil)
	key, err := ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{URL: srv.URL, Secret: key, Now: func() time.Time { return time.Unix(ts, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	if errs := s.Deliver(context.Background(), []outbox.Record{rec(msgID, payload)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	h := got()[0].header
	if g := h.Get("webhook-signature"); g != want {
		t.Errorf("webhook-signature = %q, want reference %q", g, want)
	}
	// The spec: sign "{id}.{timestamp}.{body}" with HMAC-SHA256 keyed by the
	// base64-decoded part of the secret after "whsec_"; "v1," + base64.
	k, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	m := hmac.New(sha256.New, k)
	fmt.Fprintf(m, "%s.%s.%s", h.Get("webhook-id"), h.Get("webhook-timestamp"), got()[0].body)
	if g, w := h.Get("webhook-signature"), "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)); g != w {
		t.Errorf("signature %q does not verify (want %q)", g, w)
	}
	if g, w := h.Get("webhook-timestamp"), strconv.Itoa(ts); g != w {
		t.Errorf("webhook-timestamp = %q, want %q", g, w)
	}
}

func TestHeaders(t *testing.T) {
	srv, got := recorder(t, nil)
	s, err := New(Options{URL: srv.URL + "/hook", Headers: map[string]string{"Authorization": "Bearer t", "webhook-id": "spoof", "Content-Type": "text/plain", "ce-id": "spoof"}})
	if err != nil {
		t.Fatal(err)
	}
	r := rec("0193a0b0-0000-7000-8000-000000000001", `{"id":"0193a0b0-0000-7000-8000-000000000001"}`)
	if errs := s.Deliver(context.Background(), []outbox.Record{r}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	g := got()[0]
	for k, want := range map[string]string{
		"Content-Type":      "application/json",
		"Ce-Specversion":    "1.0",
		"Ce-Id":             r.ID,
		"Ce-Source":         "cdcout/prod",
		"Ce-Type":           "cdcout.change.u",
		"Ce-Subject":        "shop.orders",
		"Ce-Time":           "2026-11-29T12:00:00.5Z",
		"Webhook-Id":        r.ID,
		"Authorization":     "Bearer t",
		"Webhook-Signature": "",
	} {
		if v := g.header.Get(k); v != want {
			t.Errorf("%s = %q, want %q", k, v, want)
		}
	}
	if g.body != string(r.Payload) {
		t.Errorf("body = %q, want the payload", g.body)
	}
	if ts, err := strconv.ParseInt(g.header.Get("webhook-timestamp"), 10, 64); err != nil || time.Since(time.Unix(ts, 0)) > time.Minute {
		t.Errorf("webhook-timestamp %q is not now", g.header.Get("webhook-timestamp"))
	}
}

func TestStructuredCloudEventsHasNoBinaryHeaders(t *testing.T) {
	srv, got := recorder(t, nil)
	f, err := format.New(format.CloudEvents)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := New(Options{URL: srv.URL, Format: f})
	r := rec("0193a0b0-0000-7000-8000-000000000002", `{"after":{"id":1},"before":null,"change_key":"g:0-1-1:0","id":"0193a0b0-0000-7000-8000-000000000002","key":{"id":1},"op":"c","source":{"connector":"cdcout","db":"shop","file":"","gtid":"0-1-1","instance":"prod","pos":0,"row":0,"server_id":1,"table":"orders","ts_ms":1,"version":"x"},"ts_ms":1}`)
	r.Op = "c"
	if errs := s.Deliver(context.Background(), []outbox.Record{r}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	h := got()[0].header
	if v := h.Get("ce-id"); v != "" {
		t.Errorf("ce-id = %q in structured mode", v)
	}
	if v := h.Get("Content-Type"); !strings.HasPrefix(v, "application/cloudevents") {
		t.Errorf("Content-Type = %q", v)
	}
}

func TestStatusClassification(t *testing.T) {
	for _, tc := range []struct {
		code       int
		header     http.Header
		body       string
		permanent  bool
		retryAfter time.Duration
		hasAfter   bool
		overloaded bool
	}{
		{200, nil, "", false, 0, false, false},
		{204, nil, "", false, 0, false, false},
		{400, nil, "bad field x\nline2", true, 0, false, false},
		{422, nil, strings.Repeat("y", 2000), true, 0, false, false},
		{404, nil, "", true, 0, false, false},
		{301, http.Header{"Location": {"https://elsewhere/"}}, "", true, 0, false, false},
		{408, nil, "", false, 0, false, false},
		{425, nil, "", false, 0, false, false},
		{429, http.Header{"Retry-After": {"7"}}, "", false, 7 * time.Second, true, true},
		{429, nil, "", false, 0, false, true},
		{503, http.Header{"Retry-After": {time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)}}, "", false, 30 * time.Second, true, true},
		{500, nil, "oops", false, 0, false, false},
		{502, nil, "", false, 0, false, false},
	} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			srv, got := recorder(t, func(int64, *http.Request) (int, http.Header, string) { return tc.code, tc.header, tc.body })
			s, _ := New(Options{URL: srv.URL})
			err := s.Deliver(context.Background(), []outbox.Record{rec("id-1", "{}")})[0]
			if tc.code < 300 {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if got, want := sink.IsPermanent(err), tc.permanent; got != want {
				t.Errorf("permanent = %v, want %v (%v)", got, want, err)
			}
			if got, want := sink.IsOverloaded(err), tc.overloaded; got != want {
				t.Errorf("overloaded = %v, want %v (%v)", got, want, err)
			}
			d, ok := sink.RetryAfterOf(err)
			if ok != tc.hasAfter || (ok && (d > tc.retryAfter || d < tc.retryAfter-2*time.Second)) {
				t.Errorf("retry after = %s, %v; want %s, %v", d, ok, tc.retryAfter, tc.hasAfter)
			}
			if !strings.Contains(err.Error(), strconv.Itoa(tc.code)) || strings.Contains(err.Error(), "\n") || len(err.Error()) > 500 {
				t.Errorf("error %q: want one bounded line with the status", err)
			}
			if tc.code == 301 && len(got()) != 1 {
				t.Errorf("redirect followed: %d requests", len(got()))
			}
		})
	}
}

func TestTimeoutAndConnectionErrorsRetry(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	s, _ := New(Options{URL: srv.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Deliver(ctx, []outbox.Record{rec("a", "{}")})[0]
	if err == nil || sink.IsPermanent(err) {
		t.Fatalf("timeout: err = %v, want retryable", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("Deliver ignored the context deadline")
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	s, _ = New(Options{URL: "http://user:hunter2@" + strings.TrimPrefix(url, "http://") + "/x?token=abc"})
	err = s.Deliver(context.Background(), []outbox.Record{rec("a", "{}")})[0]
	if err == nil || sink.IsPermanent(err) || !sink.IsOverloaded(err) {
		t.Fatalf("connection refused: err = %v, want overloaded (not an attempt)", err)
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "token=abc") {
		t.Errorf("error leaks credentials: %v", err)
	}
}

// A cold endpoint gets a handful of requests at once (the limiter's
// initial limit), not a call's worth.
func TestColdEndpointStartsAtInitialLimit(t *testing.T) {
	var inFlight, peak, served atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1) <= 3 {
			return // the limiter's probe of the floor, one at a time
		}
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
	}))
	defer srv.Close()
	s, _ := New(Options{URL: srv.URL})
	recs := make([]outbox.Record, 3+2*sink.DefaultInitialLimit)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("id-%d", i), "{}")
	}
	done := make(chan []error)
	go func() { done <- s.Deliver(context.Background(), recs) }()
	deadline := time.Now().Add(5 * time.Second)
	for peak.Load() < sink.DefaultInitialLimit && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // room for a request beyond the limit to show up
	if got, want := s.Endpoint().InFlight, sink.DefaultInitialLimit; got != want {
		t.Errorf("in flight (limiter) = %d, want %d", got, want)
	}
	close(release)
	for i, err := range <-done {
		if err != nil {
			t.Errorf("record %d: %v", i, err)
		}
	}
	if got, want := peak.Load(), int64(sink.DefaultInitialLimit); got != want {
		t.Errorf("peak concurrency = %d, want %d", got, want)
	}
}

func TestParseSecret(t *testing.T) {
	k, err := ParseSecret("whsec_aGVsbG8=")
	if err != nil || string(k) != "hello" {
		t.Errorf("whsec_ secret = %q, %v", k, err)
	}
	k, err = ParseSecret("plain")
	if err != nil || string(k) != "plain" {
		t.Errorf("raw secret = %q, %v", k, err)
	}
	if _, err := ParseSecret("whsec_!!!"); err == nil {
		t.Errorf("bad whsec_: err = %v", err)
	}
}

// Batch mode: one signed POST per call whose body is the records' bodies as
// a JSON array; a rejected batch is split so only the bad record is
// dead-lettered; a retryable answer retries them all.
func TestBatchPostsOneSignedArray(t *testing.T) {
	var mu sync.Mutex
	var reqs []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, seen{r.Header.Clone(), string(b)})
		mu.Unlock()
		switch {
		case strings.Contains(string(b), `"id":"bad"`):
			w.WriteHeader(http.StatusBadRequest)
		case strings.Contains(string(b), `"id":"busy"`):
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	got := func() []seen { mu.Lock(); defer mu.Unlock(); return append([]seen(nil), reqs...) }
	secret := []byte("batch-secret")
	s, err := New(Options{URL: srv.URL, Secret: secret, Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	var recs []outbox.Record
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("id-%d", i)
		recs = append(recs, rec(id, fmt.Sprintf(`{"id":%q,"op":"u"}`, id)))
	}
	for i, err := range s.Deliver(context.Background(), recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	first := got()
	if len(first) != 1 {
		t.Fatalf("%d requests, want 1", len(first))
	}
	r := first[0]
	want := `[{"id":"id-0","op":"u"},{"id":"id-1","op":"u"},{"id":"id-2","op":"u"},{"id":"id-3","op":"u"},{"id":"id-4","op":"u"}]`
	if r.body != want {
		t.Fatalf("body = %s, want %s", r.body, want)
	}
	id := r.header.Get("webhook-id")
	if !strings.HasPrefix(id, "batch_") || r.header.Get("Content-Type") != "application/json" || r.header.Get("ce-id") != "" {
		t.Fatalf("headers = %v", r.header)
	}
	ts, _ := strconv.ParseInt(r.header.Get("webhook-timestamp"), 10, 64)
	if sig := r.header.Get("webhook-signature"); sig != Sign(secret, id, ts, []byte(r.body)) {
		t.Fatalf("signature %s does not verify", sig)
	}
	// The same records again: the same webhook-id, so receivers can drop
	// a redelivered batch.
	s.Deliver(context.Background(), recs)
	if again := got()[1].header.Get("webhook-id"); again != id {
		t.Fatalf("redelivered batch id %s, want %s", again, id)
	}

	// One bad record among three: it alone is dead-lettered.
	mixed := []outbox.Record{rec("a", `{"id":"a"}`), rec("bad", `{"id":"bad"}`), rec("c", `{"id":"c"}`)}
	errs := s.Deliver(context.Background(), mixed)
	if errs[0] != nil || errs[2] != nil || !sink.IsPermanent(errs[1]) {
		t.Fatalf("errors = %v, want only the bad record permanent", errs)
	}
	// The split posts each record as a batch of one, with its own id.
	last := got()
	if n := len(last); n != 2+1+3 {
		t.Fatalf("%d requests in all, want 6 (2 batches, 1 rejected batch, 3 single posts)", n)
	}
	singles := map[string]bool{}
	for _, r := range last[3:] {
		singles[r.header.Get("webhook-id")] = true
	}
	if !singles["a"] || !singles["bad"] || !singles["c"] {
		t.Fatalf("single posts had ids %v, want a, bad, c", singles)
	}

	// A retryable answer fails the whole batch, retryably.
	errs = s.Deliver(context.Background(), []outbox.Record{rec("x", `{"id":"x"}`), rec("busy", `{"id":"busy"}`)})
	for i, err := range errs {
		if err == nil || sink.IsPermanent(err) {
			t.Fatalf("record %d: %v, want a retryable error", i, err)
		}
	}
}

// A 503 with Retry-After pauses the whole endpoint: inside one delivery
// (whose context allows it) the record is sent again after the pause and
// delivered, and a record of another call is not sent during the pause
// either.
func TestRetryAfterPausesEndpointWithinCall(t *testing.T) {
	var (
		mu       sync.Mutex
		first503 time.Time
		arrivals []time.Time
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if first503.IsZero() {
			first503 = time.Now()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		arrivals = append(arrivals, time.Now())
	}))
	defer srv.Close()
	s, _ := New(Options{URL: srv.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 2)
	go func() { done <- s.Deliver(ctx, []outbox.Record{rec("a", "{}")})[0] }()
	for s.Endpoint().Overloads == 0 {
		time.Sleep(time.Millisecond)
	}
	if st := s.Endpoint(); st.PausedFor <= 0 || st.Overloads != 1 {
		t.Fatalf("after a 503 with Retry-After: %+v, want the endpoint paused and one overload", st)
	}
	go func() { done <- s.Deliver(ctx, []outbox.Record{rec("b", "{}")})[0] }()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("delivery: %v, want delivered after the pause", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(arrivals) != 2 {
		t.Fatalf("%d requests after the 503, want 2", len(arrivals))
	}
	for _, at := range arrivals {
		if d := at.Sub(first503); d < 900*time.Millisecond {
			t.Errorf("a request arrived %v after the 503, inside the 1s Retry-After", d)
		}
	}
}

// A refused connect is retried under the limiter's backoff until the
// delivery ends, and comes back as overloaded (not an attempt); the
// retries are paced, not a spin.
func TestRefusedConnectBacksOffUntilCallEnds(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	s, _ := New(Options{URL: url})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := s.Deliver(ctx, []outbox.Record{rec("a", "{}")})[0]
	if !sink.IsOverloaded(err) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("err = %v, want overloaded with the connect error", err)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
		t.Errorf("delivery returned after %v, want at the call's end (1s)", d)
	}
	// Pauses of 100 ms doubling: about four connects in a second.
	if st := s.Endpoint(); st.Overloads < 2 || st.Overloads > 8 || st.Limit != 1 {
		t.Errorf("after a second of refused connects: %+v, want a few paced overloads at limit 1", st)
	}
}

// Against a fast receiver the limit grows from its start toward the
// ceiling, so a fast endpoint is not held to a handful.
func TestLimitGrowsAgainstFastReceiver(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	s, _ := New(Options{URL: srv.URL, MaxConcurrency: 16})
	recs := make([]outbox.Record, 32)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("id-%d", i), "{}")
	}
	for range 20 {
		for _, err := range s.Deliver(context.Background(), recs) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// Latency decides the last steps (the race detector slows requests).
	if st := s.Endpoint(); st.Limit <= sink.DefaultInitialLimit || st.Max != 16 || st.Floor <= 0 {
		t.Fatalf("after 640 fast requests: %+v, want the limit grown past its start", st)
	}
}
