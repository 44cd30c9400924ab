// Package httpsink delivers records as webhooks: one POST per record, the
// body the record's encoded payload (the canonical envelope by default).
//
// Each request carries the deliveryKey twice over, so a receiver can drop
// redeliveries whichever convention it follows:
//
//   - CloudEvents binary mode: ce-specversion 1.0, ce-id (the deliveryKey),
//     ce-source cdcout/<instance>, ce-type cdcout.change.<op>, ce-subject
//     <db>.<table>, ce-time (the source commit time). Left out when the
//     body is a structured-mode CloudEvent (format: cloudevents), which
//     carries them itself.
//   - Standard Webhooks (https://www.standardwebhooks.com): webhook-id (the
//     deliveryKey), webhook-timestamp (send time, unix seconds) and, when a
//     secret is set, webhook-signature "v1,<base64 HMAC-SHA256(secret,
//     id.timestamp.body)>". A secret written "whsec_<base64>" (the spec's
//     form) is base64-decoded; any other string is used as raw bytes.
//
// With Batch, one POST carries a whole delivery call (up to the pipe's
// batch size): the body is a JSON array of the records' bodies, each with
// its own "id", Content-Type application/json (application/cloudevents-
// batch+json for the cloudevents format), no ce- headers, and webhook-id
// "batch_" plus a digest of the records' ids (a batch of one has the
// record's id). The POST succeeds or fails as a whole; a permanent error
// (4xx) for a batch of several is not taken as every record's fault: the
// records are posted again one by one, so only the rejected ones are
// dead-lettered.
//
// Redirects are not followed: a webhook that moved is a configuration to
// fix, and following one would resend a signed body to another host. A 2xx
// is delivered; 408, 425, 429, 5xx, timeouts and connection errors are
// retried (Retry-After honoured); any other status dead-letters the record.
//
// Delivery adapts to the receiver (sink.Limiter): every request of the
// sink, from all its pipes, takes a slot of one adaptive concurrency limit
// that starts at a handful, grows while answers come back near the
// latency floor, and is cut on overload. Overload is a 429, a 503, or a
// connect that is refused or times out (dialTimeout, well below the
// request timeout): those requests are sent again, inside the same
// delivery, once the limit lets them (a Retry-After pauses the endpoint),
// and what is still not delivered when the drainer ends the call comes
// back as sink.Overloaded — not an attempt, never a dead letter. The
// transport opens at most the ceiling of connections to the host and
// closes idle ones when the limit is cut.
package httpsink

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cdcout/cdcout/config"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/tracing"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// Options configure a Sink.
type Options struct {
	// URL receives the POSTs.
	URL string
	// Secret signs requests (see ParseSecret); empty sends no signature.
	Secret []byte
	// Headers are added to every request (e.g. Authorization). They cannot
	// replace the content, CloudEvents or webhook headers.
	Headers map[string]string
	// Format encodes the body; nil means debezium (the stored envelope).
	Format format.Format
	// Transport overrides the HTTP transport (tests, custom TLS). Requests
	// go straight to it, not through an http.Client: redirects are never
	// followed, and the client's per-request header copying for redirects
	// (3 % of cdcout's CPU end to end) is not paid.
	Transport http.RoundTripper
	// MaxConcurrent bounds the goroutines one Deliver call runs (they wait
	// for the endpoint's limit); 0 means 32.
	MaxConcurrent int
	// MaxConcurrency is the ceiling of the endpoint's adaptive concurrency
	// limit (requests in flight, and connections to the host); 0 means
	// sink.DefaultMaxLimit.
	MaxConcurrency int
	// Timeout bounds one request once it is sent; 0 means 10s. Waiting
	// for a slot under the endpoint's limit does not count against it.
	Timeout time.Duration
	// Logger receives the rate-limited overload reports; nil logs nothing.
	Logger *zap.Logger
	// Now is the clock for webhook-timestamp; nil means time.Now.
	Now func() time.Time
	// Batch posts a delivery call's records as one JSON array (see the
	// package comment).
	Batch bool
}

// Sink posts records to one URL.
type Sink struct {
	u          *url.URL
	shownURL   string // no userinfo or query: those may hold credentials
	secret     []byte
	headers    http.Header
	format     format.Format
	structured bool
	// contentType is the Content-Type header value of a record's POST,
	// shared by every request.
	contentType []string
	rt          http.RoundTripper
	maxConc     int
	now         func() time.Time
	batch       bool
	timeout     time.Duration
	lim         *sink.Limiter
	// closeIdle closes the transport's idle connections (our own
	// transport only) once nothing is in flight after the limit was cut
	// (Limiter.WhenIdle), so the connections open stay within the limit.
	closeIdle func()
	log       *zap.Logger
	// workers run a call's requests but one (see each).
	workers *workers

	logMu      sync.Mutex
	loggedAt   time.Time
	suppressed int

	// stamp is the latest webhook-timestamp value, formatted once per
	// second rather than per request.
	stamp atomic.Pointer[stamp]
}

// stamp is a unix time and its decimal form.
type stamp struct {
	unix int64
	text string
}

// timestamp returns the webhook-timestamp value for unix time ts.
func (s *Sink) timestamp(ts int64) string {
	if st := s.stamp.Load(); st != nil && st.unix == ts {
		return st.text
	}
	st := &stamp{unix: ts, text: strconv.FormatInt(ts, 10)}
	s.stamp.Store(st)
	return st.text
}

// defaultTimeout bounds one request when Options.Timeout is 0.
const defaultTimeout = 10 * time.Second

// overloadLogEvery rate-limits the overload report.
const overloadLogEvery = 5 * time.Second

var _ outbox.Sink = (*Sink)(nil)

// snippetBytes bounds how much of an error response body goes into the
// record's last_error.
const snippetBytes = 256

// ParseSecret turns a configured secret into key bytes: "whsec_<base64>"
// is decoded as the Standard Webhooks spec defines; anything else is used
// as it is.
func ParseSecret(s string) ([]byte, error) { return config.WebhookKey(s) }

// New returns a webhook sink.
func New(opts Options) (*Sink, error) {
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("webhook url: want http(s)://host/path")
	}
	shown := u.Scheme + "://" + u.Host + u.Path
	f := opts.Format
	if f == nil {
		f, _ = format.New(format.Debezium)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	lim := sink.NewLimiter(0, opts.MaxConcurrency)
	rt := opts.Transport
	var closeIdle func()
	if rt == nil {
		// At most the limit's ceiling of requests is in flight to the
		// host; an idle pool smaller than that closed the extra
		// connections after every burst and dialled them again (5 % of
		// cdcout's CPU in the end-to-end benchmark). A connect that
		// does not complete within dialTimeout is an overload signal
		// (a full accept queue drops the SYN), not a request timeout.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = lim.Max()
		tr.MaxIdleConnsPerHost = lim.Max()
		tr.MaxConnsPerHost = lim.Max()
		dd := &dialer{d: net.Dialer{KeepAlive: 30 * time.Second}, max: dialTimeout(timeout), lim: lim}
		tr.DialContext = dd.DialContext
		rt, closeIdle = tr, tr.CloseIdleConnections
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}

	h := http.Header{}
	for k, v := range opts.Headers {
		h.Set(k, v)
	}
	maxConc := opts.MaxConcurrent
	if maxConc <= 0 {
		maxConc = 32
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Sink{
		u:           u,
		shownURL:    shown,
		secret:      opts.Secret,
		headers:     h,
		format:      f,
		structured:  strings.HasPrefix(f.ContentType(), "application/cloudevents"),
		contentType: []string{f.ContentType()},
		rt:          rt,
		maxConc:     maxConc,
		now:         now,
		batch:       opts.Batch,
		timeout:     timeout,
		lim:         lim,
		closeIdle:   closeIdle,
		workers:     newWorkers(),
		log:         log.With(zap.String("endpoint", shown)),
	}, nil
}

// dialer times a connect out after 20× the fastest connect seen lately
// (at least minDialTimeout, at most max): a connect the listener dropped
// (its accept queue full) waits a second for the SYN retransmit, and
// failing it early instead lets the limiter back off and send it again
// sooner. Against a host across the world the fastest connect is its
// round trip, so the timeout stays well above it.
type dialer struct {
	d     net.Dialer
	max   time.Duration
	lim   *sink.Limiter
	floor atomic.Int64 // ns; 0 until the first connect
}

// connectStall is how long a TCP connect takes before it counts as an
// overload signal: Linux retransmits a SYN the listener dropped (accept
// queue full) after 1 s, and few networks take 700 ms for a handshake.
const connectStall = 700 * time.Millisecond

// minDialTimeout bounds the adaptive connect timeout from below. A SYN
// the listener dropped (its accept queue full) is sent again only after
// a second, so a connect that has not completed long after the fastest
// ones is waiting for that, holding its slot of the limit and its call:
// against Python's http.server (backlog 5, a connection per request) a
// 250 ms floor here left the endpoint nearly idle after each dropped
// connect. Loopback and LAN connects take microseconds (the slowest of
// 4,000 on the loaded 2-core development machine: 5.2 ms); a far host's
// fastest connect is its round trip, and 20 × that applies.
const minDialTimeout = 50 * time.Millisecond

func (dd *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	timeout := dd.max
	if f := time.Duration(dd.floor.Load()); f > 0 {
		timeout = min(max(20*f, minDialTimeout), dd.max)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	c, err := dd.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	// The floor follows the fastest connects, and drifts up slowly when
	// the network got slower for good.
	d := time.Since(start)
	if d > connectStall {
		dd.lim.Congested() // it waited for a SYN retransmit: the accept queue is full
	}
	for {
		old := dd.floor.Load()
		next := int64(d)
		if old != 0 && int64(d) > old {
			next = old + (int64(d)-old)/64
		}
		if dd.floor.CompareAndSwap(old, next) {
			break
		}
	}
	return c, nil
}

// dialTimeout is the longest connect timeout for a request timeout: a
// quarter of it, between 1 and 3 seconds (the dialer uses less once it
// has seen how fast connects are).
func dialTimeout(requestTimeout time.Duration) time.Duration {
	return min(max(requestTimeout/4, time.Second), 3*time.Second)
}

// Close ends the goroutines kept for the next requests. Deliver still
// works after Close, on goroutines of its own.
func (s *Sink) Close() { s.workers.close() }

// Paced tells the drainer that the sink bounds each request by its own
// timeout and holds records back while the receiver is at capacity (see
// outbox.Paced).
func (s *Sink) Paced() bool { return true }

// OneRequestPerRecord tells the drainer that each record is a request of
// its own (no batch): it then hands them over one per call, so that one
// slow request holds only its own record.
func (s *Sink) OneRequestPerRecord() bool { return !s.batch }

// Endpoint reports the endpoint's adaptive concurrency state.
func (s *Sink) Endpoint() sink.LimiterStats { return s.lim.Stats() }

// URL is the endpoint without userinfo or query.
func (s *Sink) URL() string { return s.shownURL }

// Deliver posts the records concurrently (the drainer never puts two
// records of one key into a call, so order is not at stake here).
//
// Each record's attempt is a span (package tracing); its request carries
// the span's traceparent. A batch POST carries its first record's.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) (errs []error) {
	if len(recs) == 0 {
		return nil
	}
	spans := tracing.Start(ctx, "webhook", recs)
	defer func() { spans.End(errs) }()
	if s.batch {
		return s.deliverBatch(spans.Context(0), recs)
	}
	errs = make([]error, len(recs))
	s.each(len(recs), func(i int) { errs[i] = s.post(spans.Context(i), recs[i]) })
	return errs
}

// each runs f(0) … f(n-1), at most MaxConcurrent at once, and returns when
// all have: the last on the caller's goroutine, which would only wait
// otherwise, the others on the sink's workers. Up to MaxConcurrent need no
// semaphore.
func (s *Sink) each(n int, f func(i int)) {
	if n == 1 || s.maxConc == 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var sem chan struct{}
	if n > s.maxConc {
		sem = make(chan struct{}, s.maxConc-1) // the caller's is the last slot
	}
	var wg sync.WaitGroup
	for i := range n - 1 {
		if sem != nil {
			sem <- struct{}{}
		}
		wg.Add(1)
		s.workers.run(func() {
			defer wg.Done()
			f(i)
			if sem != nil {
				<-sem
			}
		})
	}
	f(n - 1)
	wg.Wait()
}

// Sign returns the Standard Webhooks signature header value for a message.
func Sign(secret []byte, id string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(ts, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func (s *Sink) post(ctx context.Context, rec outbox.Record) error {
	body, err := s.format.Encode(rec)
	if err != nil {
		return sink.Permanent(fmt.Errorf("encode %s: %w", rec.ID, err))
	}
	// Keys in canonical form, assigned directly: Header.Set canonicalises
	// every key on every request. The values are slices of one backing
	// array, the record's own ones cut from one string, and the constant
	// ones shared by every request (a transport only reads a request's
	// headers): one allocation for what was eleven.
	h := make(http.Header, 12)
	h["Content-Type"] = s.contentType
	if !s.structured {
		h["Ce-Specversion"] = ceSpecVersion
		var buf [160]byte
		b := format.AppendCESource(buf[:0], rec)
		src := len(b)
		b = format.AppendCEType(b, rec)
		typ := len(b)
		b = format.AppendCESubject(b, rec)
		subj := len(b)
		b = format.AppendCETime(b, rec)
		all := string(b)
		v := make([]string, 5)
		v[0], v[1], v[2], v[3], v[4] = all[:src], all[src:typ], all[typ:subj], all[subj:], rec.ID
		h["Ce-Id"] = v[4:5:5]
		h["Ce-Source"] = v[0:1:1]
		h["Ce-Type"] = v[1:2:2]
		h["Ce-Subject"] = v[2:3:3]
		if v[3] != "" {
			h["Ce-Time"] = v[3:4:4]
		}
	}
	return s.send(ctx, rec.ID, h, body)
}

// ceSpecVersion is the Ce-Specversion header value, shared by every
// request.
var ceSpecVersion = []string{format.CESpecVersion}

// deliverBatch posts recs as one JSON array; see the package comment.
func (s *Sink) deliverBatch(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	body := []byte{'['}
	ok := make([]int, 0, len(recs)) // indexes of the records in the body
	for i, rec := range recs {
		b, err := s.format.Encode(rec)
		if err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("encode %s: %w", rec.ID, err))
			continue
		}
		if len(ok) > 0 {
			body = append(body, ',')
		}
		body = append(body, b...)
		ok = append(ok, i)
	}
	body = append(body, ']')
	if len(ok) == 0 {
		return errs
	}
	id := recs[ok[0]].ID
	if len(ok) > 1 {
		h := sha256.New()
		for _, i := range ok {
			h.Write([]byte(recs[i].ID))
			h.Write([]byte{','})
		}
		id = "batch_" + hex.EncodeToString(h.Sum(nil)[:16])
	}
	ct := "application/json"
	if s.structured {
		ct = "application/cloudevents-batch+json"
	}
	h := http.Header{}
	h.Set("Content-Type", ct)
	err := s.send(ctx, id, h, body)
	if err != nil && sink.IsPermanent(err) && len(ok) > 1 {
		// Find the records the receiver rejects: each on its own.
		s.each(len(ok), func(j int) {
			i := ok[j]
			errs[i] = s.deliverBatch(ctx, recs[i:i+1])[0]
		})
		return errs
	}
	for _, i := range ok {
		errs[i] = err
	}
	return errs
}

// send POSTs body under the endpoint's limit, and again while the
// receiver says it is overloaded and ctx allows (a ctx that never ends gets
// the first answer). ctx bounds the waiting; a request once sent runs to
// its own timeout even if ctx is cancelled meanwhile (a stop lets the
// requests under way finish).
func (s *Sink) send(ctx context.Context, id string, h http.Header, body []byte) error {
	var last error
	for {
		tok, err := s.lim.Acquire(ctx)
		if err != nil {
			if last != nil {
				return sink.Overloaded(fmt.Errorf("%w; last answer: %w", err, last))
			}
			return sink.Overloaded(fmt.Errorf("post %s: %w", s.shownURL, err))
		}
		sig, ra, err := s.sendOnce(ctx, id, h, body)
		if cut := tok.Done(sig, ra); cut && s.closeIdle != nil {
			s.lim.WhenIdle(s.closeIdle)
		}
		if err == nil || !sink.IsOverloaded(err) {
			return err
		}
		s.reportOverload(err)
		last = err
		if ctx.Done() == nil || ctx.Err() != nil {
			return err
		}
	}
}

// reportOverload logs an overload answer at most every overloadLogEvery,
// with the number of such answers left out meanwhile.
func (s *Sink) reportOverload(err error) {
	s.logMu.Lock()
	if time.Since(s.loggedAt) < overloadLogEvery {
		s.suppressed++
		s.logMu.Unlock()
		return
	}
	n := s.suppressed
	s.loggedAt, s.suppressed = time.Now(), 0
	s.logMu.Unlock()
	st := s.lim.Stats()
	s.log.Warn("receiver overloaded; slowing down (not counted as a delivery attempt)",
		zap.String("error", err.Error()), zap.Int("limit", st.Limit), zap.Duration("paused_for", st.PausedFor),
		zap.Int("suppressed", n))
}

// sendOnce POSTs body with the given headers plus the configured ones and
// the Standard Webhooks headers for message id, and maps the answer to
// delivered (nil), overloaded, retry or permanent, and to what it says
// about the receiver's capacity.
func (s *Sink) sendOnce(ctx context.Context, id string, h http.Header, body []byte) (sink.Signal, time.Duration, error) {
	// One context, its deadline the earlier of the request timeout and
	// ctx's (two nested ones and the URL parsed again for every request
	// were a tenth of cdcout's CPU with one POST per record).
	deadline := time.Now().Add(s.timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	req := s.request(rctx, body)
	for k, v := range s.headers {
		if _, own := h[k]; !own { // never the content or CloudEvents headers
			h[k] = v
		}
	}
	ts := s.now().Unix()
	v := make([]string, 3) // one backing array for the three values
	v[0], v[1] = id, s.timestamp(ts)
	h["Webhook-Id"] = v[0:1:1]
	h["Webhook-Timestamp"] = v[1:2:2]
	if len(s.secret) > 0 {
		v[2] = Sign(s.secret, id, ts, body)
		h["Webhook-Signature"] = v[2:3:3]
	}
	for k, v := range tracing.Headers(ctx) {
		h[http.CanonicalHeaderKey(k)] = []string{v}
	}
	req.Header = h

	resp, err := s.rt.RoundTrip(req)
	if err != nil {
		err = fmt.Errorf("post %s: %w", s.shownURL, transportError(err))
		var op *net.OpError
		switch {
		case errors.As(err, &op) && op.Op == "dial":
			// Refused, or not accepted within dialTimeout: the request
			// never reached the receiver.
			return sink.Overload, 0, sink.Overloaded(err)
		case isTimeout(err):
			// Sent, maybe processed: an attempt, and a sign of overload.
			return sink.Overload, 0, err
		}
		return sink.Failed, 0, err
	}
	defer func() {
		// Drain a little so the connection can be reused (nothing to
		// drain from an empty body, the usual answer).
		if resp.Body != http.NoBody {
			_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		}
		resp.Body.Close()
	}()
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return sink.Success, 0, nil
	}
	snippet := readSnippet(resp.Body)
	err = fmt.Errorf("post %s: http %d%s", s.shownURL, code, snippet)
	ra, hasRA := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	switch {
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable:
		if hasRA {
			return sink.Overload, ra, sink.Overloaded(sink.RetryAfter(err, ra))
		}
		return sink.Overload, 0, sink.Overloaded(err)
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code >= 500:
		sig := sink.Failed
		if code == http.StatusRequestTimeout || code == http.StatusBadGateway || code == http.StatusGatewayTimeout {
			sig = sink.Overload // a proxy whose upstream does not keep up
		}
		if hasRA {
			return sig, 0, sink.RetryAfter(err, ra)
		}
		return sig, 0, err
	case code >= 300 && code < 400:
		return sink.Success, 0, sink.Permanent(fmt.Errorf("post %s: http %d redirect to %q not followed (point the sink at the final URL)", s.shownURL, code, resp.Header.Get("Location")))
	default:
		return sink.Success, 0, sink.Permanent(err)
	}
}

// request is what http.NewRequestWithContext makes of a POST of body to
// the sink's URL, without parsing the URL again: the parsed one is shared
// (a RoundTripper does not modify a request's URL).
func (s *Sink) request(ctx context.Context, body []byte) *http.Request {
	req := &http.Request{
		Method: http.MethodPost, URL: s.u, Host: strings.TrimSuffix(s.u.Host, ":"), // as http.NewRequest: no empty port
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Body: http.NoBody, GetBody: func() (io.ReadCloser, error) { return http.NoBody, nil },
	}
	if len(body) > 0 {
		req.ContentLength = int64(len(body))
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	return req.WithContext(ctx)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// transportError strips url.Error's copy of the URL, which may carry
// credentials, keeping the cause.
func transportError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("timeout: %w", err)
	}
	return err
}

// readSnippet returns ": <first bytes of the body>" on one line, or "".
func readSnippet(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, snippetBytes+1))
	if len(b) == 0 {
		return ""
	}
	cut := len(b) > snippetBytes
	if cut {
		b = b[:snippetBytes]
	}
	for !utf8.Valid(b) && len(b) > 0 {
		b = b[:len(b)-1]
	}
	s := strings.Join(strings.Fields(string(b)), " ")
	if cut {
		s += "…"
	}
	return ": " + s
}

// parseRetryAfter reads a Retry-After value: delay seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return 0, false
}
