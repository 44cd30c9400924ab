package tracing_test

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/internal/tracing"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink/httpsink"
	"github.com/cdcout/cdcout/sink/natssink"
)

// collector is an in-process OTLP/HTTP trace receiver: it decodes every
// export request (protobuf) and keeps the spans.
type collector struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "want an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func attrs(s *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.GetStringValue()
	}
	return m
}

// setup turns tracing on against the collector, as `cdcout run` does,
// and returns the flush; the globals are reset when the test ends.
func setup(t *testing.T, c *collector) func() {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.srv.URL)
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
	shutdown, err := tracing.Setup(context.Background(), "replica-1", "test")
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := shutdown(context.Background()); err != nil {
			t.Fatalf("flush traces: %v", err)
		}
	}
}

// envelopeRecord is a record whose payload is an envelope with a GTID.
func envelopeRecord(k string, n int) outbox.Record {
	r := sinktest.Record("hook", k, n)
	r.Payload = []byte(`{"id":"` + r.ID + `","op":"c","source":{"db":"shop","gtid":"0-1-4` + k + `","table":"items"}}`)
	return r
}

// TestWebhookTraceparentJoinsExportedSpan delivers records through the
// real webhook sink with tracing on: each delivery attempt is a span
// exported to the collector with the delivery id, pipe and GTID, and the
// receiver sees that span's traceparent.
func TestWebhookTraceparentJoinsExportedSpan(t *testing.T) {
	col := newCollector(t)
	flush := setup(t, col)
	var mu sync.Mutex
	seen := map[string]string{} // webhook-id → traceparent
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("webhook-id")] = r.Header.Get("traceparent")
		mu.Unlock()
		if strings.HasSuffix(r.Header.Get("webhook-id"), "b-000001") {
			http.Error(w, "no", http.StatusBadRequest)
		}
	}))
	defer recv.Close()
	s, err := httpsink.New(httpsink.Options{URL: recv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	recs := []outbox.Record{envelopeRecord("a", 1), envelopeRecord("b", 1)}
	errs := s.Deliver(context.Background(), recs)
	if errs[0] != nil || errs[1] == nil {
		t.Fatalf("deliver: %v, want the first delivered and the second refused", errs)
	}
	flush()

	col.mu.Lock()
	spans := col.spans
	col.mu.Unlock()
	if len(spans) != 2 {
		t.Fatalf("collector got %d spans, want 2 (one per delivery attempt)", len(spans))
	}
	for _, rec := range recs {
		var span *tracepb.Span
		for _, sp := range spans {
			if attrs(sp)["cdcout.delivery_id"] == rec.ID {
				span = sp
			}
		}
		if span == nil {
			t.Fatalf("no span with cdcout.delivery_id %s", rec.ID)
		}
		a := attrs(span)
		if a["cdcout.pipe"] != rec.Pipe || a["cdcout.gtid"] != "0-1-4"+strings.Split(rec.ID, "-")[4] {
			t.Errorf("span attributes %v, want pipe %s and the record's gtid", a, rec.Pipe)
		}
		want := "00-" + hex.EncodeToString(span.TraceId) + "-" + hex.EncodeToString(span.SpanId) + "-01"
		if got := seen[rec.ID]; got != want {
			t.Errorf("receiver saw traceparent %q for %s, want the exported span's %q", got, rec.ID, want)
		}
		failed := span.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR
		if failed != strings.HasSuffix(rec.ID, "b-000001") {
			t.Errorf("span of %s: status %v", rec.ID, span.Status)
		}
	}
}

// TestNATSHeaderCarriesTraceparent: the message in the stream carries the
// exported span's traceparent header (Kafka's and Redis's are set the
// same way, by tracing.Headers).
func TestNATSHeaderCarriesTraceparent(t *testing.T) {
	col := newCollector(t)
	flush := setup(t, col)
	srv := sinktest.RunNATS(t, nil)
	st := sinktest.AddStream(t, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc"}})
	s, err := natssink.New(context.Background(), natssink.Options{URL: srv.ClientURL(), SubjectTemplate: "cdc"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := envelopeRecord("n", 1)
	sinktest.NoErrors(t, s.Deliver(context.Background(), []outbox.Record{rec}))
	flush()
	msg, err := st.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.spans) != 1 {
		t.Fatalf("collector got %d spans, want 1", len(col.spans))
	}
	sp := col.spans[0]
	want := "00-" + hex.EncodeToString(sp.TraceId) + "-" + hex.EncodeToString(sp.SpanId) + "-01"
	if got := msg.Header.Get("traceparent"); got != want {
		t.Fatalf("message header traceparent %q, want %q", got, want)
	}
}

// TestOffByDefault: without an OTLP endpoint nothing is set up and no
// header is added.
func TestOffByDefault(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if tracing.Enabled() {
		t.Fatal("tracing enabled without an endpoint")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if tracing.Enabled() {
		t.Fatal("tracing enabled with OTEL_SDK_DISABLED=true")
	}
	if _, err := tracing.Setup(context.Background(), "r", "v"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := tracing.Start(ctx, "hook", []outbox.Record{envelopeRecord("a", 1), envelopeRecord("b", 2)})
	for i := range 2 {
		if h := tracing.Headers(a.Context(i)); len(h) != 0 {
			t.Fatalf("headers %v with tracing off", h)
		}
		// No span started: the record is sent under the caller's context.
		if a.Context(i) != ctx {
			t.Fatalf("record %d's context is not the caller's with tracing off", i)
		}
	}
	a.End([]error{nil, errors.New("refused")})
}
