package consumer_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/cdcout/cdcout/consumer"
	"github.com/cdcout/cdcout/sink/httpsink"
)

// A receiver for a cdcout webhook sink configured with
// `secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`: signatures verified,
// redeliveries within a day dropped. The request below is signed the way
// cdcout signs, and sent twice, as a retry after a lost answer would be.
func ExampleHandler() {
	v, err := consumer.NewVerifier("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		log.Fatal(err)
	}
	h := &consumer.Handler{
		Verifier: v,
		Dedup:    consumer.NewDedup(24*time.Hour, 1_000_000),
		Process: func(ctx context.Context, c consumer.Change) error {
			fmt.Printf("%s %s.%s key=%s after=%s\n", c.Op, c.DB, c.Table, c.Key, c.After)
			return nil // an error answers 500: cdcout retries
		},
	}
	srv := httptest.NewServer(h) // in a service: http.Handle("/cdc", h)
	defer srv.Close()

	body := `{"after":{"id":7,"name":"Ada"},"before":null,"change_key":"g:0-1-9:0","id":"0192f3a0-7c1f-7000-8000-000000000007",` +
		`"key":{"id":7},"op":"c","source":{"db":"shop","gtid":"0-1-9","table":"items","ts_ms":1764420001000},"ts_ms":1764420001050}`
	key, _ := httpsink.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	for range 2 {
		ts := time.Now().Unix()
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(body))
		req.Header.Set("webhook-id", "0192f3a0-7c1f-7000-8000-000000000007")
		req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("webhook-signature", httpsink.Sign(key, "0192f3a0-7c1f-7000-8000-000000000007", ts, []byte(body)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	// Output:
	// c shop.items key={"id":7} after={"id":7,"name":"Ada"}
	// 204
	// 204
}

// Decoding a record read from Kafka, NATS, a Redis stream's body field or
// the file sink.
func ExampleDecodeOne() {
	c, err := consumer.DecodeOne([]byte(`{"data":{"id":3},"database":"shop","table":"items","type":"delete","ts":1764420001}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Format, c.Op, c.DB, c.Table, string(c.Before), c.CommitTime.Format(time.RFC3339))
	// Output: maxwell d shop items {"id":3} 2025-11-29T12:40:01Z
}
