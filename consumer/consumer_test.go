package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/consumer"
	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/sink/httpsink"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// record is the outbox record of one of format's golden envelopes (its
// testdata is the documented shape of every format).
func record(t *testing.T, name string) outbox.Record {
	t.Helper()
	payload, err := os.ReadFile(filepath.Join("..", "format", "testdata", name+".envelope.json"))
	if err != nil {
		t.Fatal(err)
	}
	payload = bytes.TrimSpace(payload)
	var env struct {
		ID     string          `json:"id"`
		Op     canonical.Op    `json:"op"`
		Key    json.RawMessage `json:"key"`
		Source struct {
			Instance, DB, Table string
			TsMs                int64 `json:"ts_ms"`
		}
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		t.Fatal(err)
	}
	switch env.Op { // as stored (one letter)
	case canonical.TransactionOpName:
		env.Op = canonical.OpTransaction
	case canonical.DDLOpName:
		env.Op = canonical.OpDDL
	}
	return outbox.Record{ID: env.ID, Pipe: env.Source.Instance + ":" + env.Source.DB + "." + env.Source.Table + ":hook",
		Sink: "hook", DB: env.Source.DB, Table: env.Source.Table, Op: env.Op, Key: string(env.Key),
		Payload: payload, Attempt: 1, CommitTime: time.UnixMilli(env.Source.TsMs)}
}

// receiver is an httptest server built from the kit; it records every
// change processed.
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	got      []consumer.Change
	failNext int // Process fails this many more times
	errors   []int
}

func newReceiver(t *testing.T, v *consumer.Verifier, d *consumer.Dedup) *receiver {
	r := &receiver{}
	h := &consumer.Handler{
		Verifier: v,
		Dedup:    d,
		Process: func(_ context.Context, c consumer.Change) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.failNext > 0 {
				r.failNext--
				return errors.New("database busy")
			}
			r.got = append(r.got, c)
			return nil
		},
		OnError: func(_ *http.Request, status int, _ error) {
			r.mu.Lock()
			r.errors = append(r.errors, status)
			r.mu.Unlock()
		},
	}
	r.srv = httptest.NewServer(h)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) changes() []consumer.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]consumer.Change(nil), r.got...)
}

func newSink(t *testing.T, url, fmtName, secretText string, edit func(*httpsink.Options)) *httpsink.Sink {
	t.Helper()
	key, err := httpsink.ParseSecret(secretText)
	if err != nil {
		t.Fatal(err)
	}
	f, err := format.New(fmtName)
	if err != nil {
		t.Fatal(err)
	}
	o := httpsink.Options{URL: url, Secret: key, Format: f, Timeout: 5 * time.Second}
	if edit != nil {
		edit(&o)
	}
	s, err := httpsink.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func deliver(t *testing.T, s *httpsink.Sink, recs ...outbox.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.Deliver(ctx, recs)
}

// TestEveryFormatVerifiedParsedAndDeduplicated sends the four kinds of
// change through the real webhook sink, in each format, one by one and
// as a batch, each twice: the receiver verifies every signature, parses
// the same fields out of every format and processes each record once.
func TestEveryFormatVerifiedParsedAndDeduplicated(t *testing.T) {
	v, err := consumer.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	recs := []outbox.Record{record(t, "insert"), record(t, "update"), record(t, "delete"), record(t, "read")}
	for _, fname := range format.Names {
		for _, batch := range []bool{false, true} {
			if batch && fname == format.Maxwell {
				// A maxwell body has no id: a batch of them can only be
				// deduplicated whole, by webhook-id, which the kit does not
				// do (README, Consumer kit).
				continue
			}
			name := fname
			if batch {
				name += "/batch"
			}
			t.Run(name, func(t *testing.T) {
				r := newReceiver(t, v, consumer.NewDedup(time.Hour, 1000))
				s := newSink(t, r.srv.URL, fname, secret, func(o *httpsink.Options) { o.Batch = batch })
				for range 2 {
					if batch {
						sinktest.NoErrors(t, deliver(t, s, recs...))
					} else {
						for _, rec := range recs {
							sinktest.NoErrors(t, deliver(t, s, rec))
						}
					}
				}
				wantFormat := fname
				if fname == format.Native {
					wantFormat = format.Debezium // the same envelope for row changes
				}
				got := r.changes()
				if len(got) != len(recs) {
					t.Fatalf("processed %d changes, want %d (each once)", len(got), len(recs))
				}
				for i, c := range got {
					want := recs[i]
					if c.ID != want.ID || c.Op != string(want.Op) || c.DB != want.DB || c.Table != want.Table || c.Format != wantFormat {
						t.Errorf("change %d = {id %s op %s %s.%s format %s}, want {%s %s %s.%s %s}",
							i, c.ID, c.Op, c.DB, c.Table, c.Format, want.ID, want.Op, want.DB, want.Table, wantFormat)
					}
					if c.GTID != "0-1-43" && c.GTID != "0-1-42" && c.GTID != "0-1-44" && c.GTID != "" {
						t.Errorf("change %d: gtid %q", i, c.GTID)
					}
					if c.CommitTime.IsZero() {
						t.Errorf("change %d: no commit time", i)
					}
					if fname != "maxwell" && string(c.Key) != want.Key {
						t.Errorf("change %d: key %s, want %s", i, c.Key, want.Key)
					}
					switch c.Op {
					case "d":
						if string(c.After) != "null" || string(c.Before) == "null" {
							t.Errorf("delete: before %s after %s", c.Before, c.After)
						}
					default:
						if string(c.After) == "null" {
							t.Errorf("%s: no after image", c.Op)
						}
					}
				}
			})
		}
	}
}

func TestBadSignatureIsRefused(t *testing.T) {
	v, err := consumer.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t, v, nil)
	s := newSink(t, r.srv.URL, "debezium", "whsec_"+"c29tZSBvdGhlciBzZWNyZXQ=", nil)
	err = deliver(t, s, record(t, "insert"))[0]
	if err == nil || !sink.IsPermanent(err) {
		t.Fatalf("delivery with another secret: %v, want a permanent (401) error", err)
	}
	if !strings.Contains(err.Error(), "401") {
		t.Errorf("error %q does not show the 401", err)
	}
	unsigned := newSink(t, r.srv.URL, "debezium", "", nil)
	if err := deliver(t, unsigned, record(t, "insert"))[0]; err == nil {
		t.Fatal("unsigned delivery accepted")
	}
	if n := len(r.changes()); n != 0 {
		t.Fatalf("processed %d changes from requests with bad signatures", n)
	}
	// Rotation: a receiver holding the old and the new secret takes both.
	v2, err := consumer.NewVerifier("whsec_c29tZSBvdGhlciBzZWNyZXQ=", secret)
	if err != nil {
		t.Fatal(err)
	}
	r2 := newReceiver(t, v2, nil)
	sinktest.NoErrors(t, deliver(t, newSink(t, r2.srv.URL, "debezium", secret, nil), record(t, "insert")))
	sinktest.NoErrors(t, deliver(t, newSink(t, r2.srv.URL, "debezium", "whsec_c29tZSBvdGhlciBzZWNyZXQ=", nil), record(t, "update")))
}

func TestOldTimestampIsRefused(t *testing.T) {
	v, err := consumer.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t, v, nil)
	past := func() time.Time { return time.Now().Add(-10 * time.Minute) }
	s := newSink(t, r.srv.URL, "debezium", secret, func(o *httpsink.Options) { o.Now = past })
	if err := deliver(t, s, record(t, "insert"))[0]; err == nil {
		t.Fatal("a request signed 10 minutes ago was accepted (replay)")
	}
	v.Tolerance = time.Hour
	sinktest.NoErrors(t, deliver(t, s, record(t, "insert")))
}

// TestFailedProcessingIsRetried: a record whose processing failed is not
// remembered, so cdcout's retry processes it; the one that succeeded is
// then dropped.
func TestFailedProcessingIsRetried(t *testing.T) {
	r := newReceiver(t, nil, consumer.NewDedup(time.Hour, 0))
	r.failNext = 1
	s := newSink(t, r.srv.URL, "debezium", "", nil)
	err := deliver(t, s, record(t, "insert"))[0]
	if err == nil || sink.IsPermanent(err) {
		t.Fatalf("delivery whose processing failed: %v, want a retryable error", err)
	}
	sinktest.NoErrors(t, deliver(t, s, record(t, "insert")))
	sinktest.NoErrors(t, deliver(t, s, record(t, "insert")))
	if got := len(r.changes()); got != 1 {
		t.Fatalf("processed %d times, want once", got)
	}
	if got := r.errors; len(got) != 1 || got[0] != http.StatusInternalServerError {
		t.Fatalf("receiver answered errors %v, want one 500", got)
	}
}

func TestBadBodyIs400(t *testing.T) {
	r := newReceiver(t, nil, nil)
	for _, body := range []string{`{"hello":1}`, `not json`, `[{"op":"c"}]`} {
		resp, err := http.Post(r.srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("body %s answered %d, want 400", body, resp.StatusCode)
		}
	}
}

func TestDedupWindowAndBound(t *testing.T) {
	d := consumer.NewDedup(time.Minute, 3)
	runs := 0
	count := func() error { runs++; return nil }
	for _, id := range []string{"a", "b", "a", "c", "d", "a"} {
		if _, err := d.Do(id, count); err != nil {
			t.Fatal(err)
		}
	}
	// a, b, c, d processed; the bound of 3 forgot "a" when "d" came, so
	// the last "a" ran again.
	if runs != 5 {
		t.Fatalf("ran %d times, want 5", runs)
	}
	if got := d.Len(); got != 3 {
		t.Fatalf("remembers %d ids, want 3", got)
	}
	short := consumer.NewDedup(50*time.Millisecond, 0)
	short.Do("x", count)
	if !short.Seen("x") {
		t.Fatal("x not remembered")
	}
	deadline := time.Now().Add(5 * time.Second)
	for short.Seen("x") {
		if time.Now().After(deadline) {
			t.Fatal("x still remembered 5 s after a 50 ms window")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDedupConcurrentRedeliveryRunsOnce(t *testing.T) {
	d := consumer.NewDedup(time.Minute, 0)
	var mu sync.Mutex
	runs := 0
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.Do("same", func() error {
				mu.Lock()
				runs++
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				return nil
			})
		}()
	}
	wg.Wait()
	if runs != 1 {
		t.Fatalf("ran %d times for one id delivered 20 times at once, want 1", runs)
	}
}

// TestDecodeSchemaChanges: a schema-change record decodes in every
// format, as op "ddl" of its table (Debezium's form of a TRUNCATE is its
// op "t"), with the record itself in Body.
func TestDecodeSchemaChanges(t *testing.T) {
	for _, fname := range format.Names {
		for _, name := range []string{"ddl-alter", "ddl-truncate"} {
			rec := record(t, name)
			f, err := format.New(fname)
			if err != nil {
				t.Fatal(err)
			}
			body, err := f.Encode(rec)
			if err != nil {
				t.Fatal(err)
			}
			c, err := consumer.DecodeOne(body)
			if err != nil {
				t.Fatalf("%s %s: %v", fname, name, err)
			}
			want := "ddl"
			if fname == format.Debezium && name == "ddl-truncate" {
				want = "t"
			}
			if c.Op != want || c.DB != "shop" || c.Table != "items" || !bytes.Equal(c.Body, body) {
				t.Errorf("%s %s: op %q %s.%s, want %s shop.items", fname, name, c.Op, c.DB, c.Table, want)
			}
		}
	}
}

// TestRecordsWithoutRowDecodeWithDeliveryID sends a transaction's BEGIN
// and END, a change of it and a heartbeat through the real webhook sink
// in each format, each twice: every one is processed once, under its
// delivery id — in the debezium format a transaction record's id is the
// transaction's, the same on BEGIN and END, so deduplicating on it would
// drop the END — with its op and the transaction's id.
func TestRecordsWithoutRowDecodeWithDeliveryID(t *testing.T) {
	recs := []outbox.Record{record(t, "tx-begin"), record(t, "insert-tx"), record(t, "tx-end"), record(t, "heartbeat")}
	wantOp := []string{"tx", "c", "tx", "hb"}
	wantTx := []string{"0-1-43", "0-1-43", "0-1-43", ""}
	for _, fname := range format.Names {
		t.Run(fname, func(t *testing.T) {
			r := newReceiver(t, nil, consumer.NewDedup(time.Hour, 1000))
			s := newSink(t, r.srv.URL, fname, secret, nil)
			for range 2 {
				for _, rec := range recs {
					sinktest.NoErrors(t, deliver(t, s, rec))
				}
			}
			got := r.changes()
			if len(got) != len(recs) {
				t.Fatalf("processed %d records, want %d (each once)", len(got), len(recs))
			}
			for i, c := range got {
				if c.ID != recs[i].ID || c.Op != wantOp[i] || c.DB != recs[i].DB || c.Table != recs[i].Table {
					t.Errorf("record %d = {id %s op %s %s.%s}, want {%s %s %s.%s}",
						i, c.ID, c.Op, c.DB, c.Table, recs[i].ID, wantOp[i], recs[i].DB, recs[i].Table)
				}
				if c.TxID != wantTx[i] && (fname != format.Maxwell || c.Op != "c") {
					t.Errorf("record %d (op %s): transaction id %q, want %q", i, c.Op, c.TxID, wantTx[i])
				}
				if c.CommitTime.IsZero() && c.Op != "hb" {
					t.Errorf("record %d (op %s): no commit time", i, c.Op)
				}
			}
		})
	}
}
