// Package tracing is cdcout's OpenTelemetry tracing: off unless an OTLP
// endpoint is configured the OpenTelemetry way (OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true turns it
// off again), then one span per delivery attempt of a record, carrying its
// delivery id, pipe and GTID, whose W3C trace context (traceparent) the
// sinks send along (webhook request headers, Kafka and NATS message
// headers, a Redis stream entry's field), so that a consumer can join the
// trace.
//
// The sinks use the OpenTelemetry global tracer provider and propagator,
// which are no-ops until Setup installs real ones: with tracing off a
// delivery starts no span at all.
package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdcout/cdcout/outbox"
)

// scopeName names cdcout's tracer.
const scopeName = "github.com/cdcout/cdcout"

// Span attribute keys.
const (
	attrDeliveryID = attribute.Key("cdcout.delivery_id")
	attrPipe       = attribute.Key("cdcout.pipe")
	attrSink       = attribute.Key("cdcout.sink")
	attrGTID       = attribute.Key("cdcout.gtid")
	attrAttempt    = attribute.Key("cdcout.attempt")
)

// Enabled reports whether the environment asks for trace export.
func Enabled() bool {
	if v, _ := strconv.ParseBool(os.Getenv("OTEL_SDK_DISABLED")); v {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs an OTLP/HTTP exporter (configured by the standard
// OTEL_EXPORTER_OTLP_* variables) as the global tracer provider, and the
// W3C trace-context propagator, when Enabled. It returns the function that
// flushes and stops it (a no-op when tracing is off).
func Setup(ctx context.Context, replicaID, version string) (shutdown func(context.Context) error, err error) {
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName("cdcout"),
		semconv.ServiceVersion(version),
		semconv.ServiceInstanceID(replicaID),
	))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	installed.Store(true)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return func(ctx context.Context) error {
		installed.Store(false) // nothing is exported after this anyway
		return tp.Shutdown(ctx)
	}, nil
}

// installed is set once Setup has installed a tracer provider: until then
// the global one is OpenTelemetry's no-op, whose spans record nothing and
// carry no context a propagator (also a no-op until Setup) would send.
var installed atomic.Bool

// Attempts are the spans of one delivery call's records; with tracing off
// there are none and every record's context is ctx.
type Attempts struct {
	ctx   context.Context
	ctxs  []context.Context
	spans []trace.Span
}

// Start starts one span per record, a child of ctx's span if it has one,
// and returns them with each record's context (which the sink's request
// or message for that record is sent under). End them with End.
func Start(ctx context.Context, sinkName string, recs []outbox.Record) *Attempts {
	if !installed.Load() {
		// A no-op span start per record was a fifth of the Kafka sink's
		// own CPU in BenchmarkKafkaEndToEnd.
		return &Attempts{ctx: ctx}
	}
	tracer := otel.Tracer(scopeName)
	a := &Attempts{ctxs: make([]context.Context, len(recs)), spans: make([]trace.Span, len(recs))}
	for i, rec := range recs {
		a.ctxs[i], a.spans[i] = tracer.Start(ctx, "cdcout.deliver", trace.WithSpanKind(trace.SpanKindProducer))
		if !a.spans[i].IsRecording() {
			continue
		}
		a.spans[i].SetAttributes(
			attrDeliveryID.String(rec.ID),
			attrPipe.String(rec.Pipe),
			attrSink.String(sinkName),
			attrAttempt.Int(rec.Attempt),
			semconv.DBNamespace(rec.DB),
			attribute.String("db.collection.name", rec.Table),
		)
		if g := gtid(rec.Payload); g != "" {
			a.spans[i].SetAttributes(attrGTID.String(g))
		}
	}
	return a
}

// Context is record i's context.
func (a *Attempts) Context(i int) context.Context {
	if a.ctxs == nil {
		return a.ctx
	}
	return a.ctxs[i]
}

// End ends every span with its record's outcome.
func (a *Attempts) End(errs []error) {
	for i, s := range a.spans {
		if i < len(errs) && errs[i] != nil {
			s.RecordError(errs[i])
			s.SetStatus(codes.Error, errs[i].Error())
		}
		s.End()
	}
}

// Headers is the trace context of ctx as message headers ("traceparent",
// and "tracestate" when there is one); empty when ctx has no span that is
// sampled or tracing is off.
func Headers(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil // tracing off: nothing to send, nothing allocated
	}
	c := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, c)
	return c
}

// gtid reads source.gtid from a canonical envelope ("" when it has none).
func gtid(payload []byte) string {
	if !bytes.Contains(payload, []byte(`"gtid"`)) {
		return ""
	}
	var env struct {
		Source struct {
			GTID string `json:"gtid"`
		} `json:"source"`
	}
	_ = json.Unmarshal(payload, &env) // a payload is always an envelope; a bad one just has no gtid
	return env.Source.GTID
}
