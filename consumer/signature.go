// Package consumer is the receiving half of cdcout's delivery guarantee,
// for Go services that take cdcout's webhooks: it verifies the Standard
// Webhooks signature, parses a record in each of cdcout's formats
// (debezium, cloudevents, maxwell; one record or a batch), and drops
// redeliveries by delivery id within a window.
//
// cdcout delivers at least once: a record is retried until the receiver
// answers 2xx, and a retry after a lost answer, a crash or a leadership
// change reaches the receiver again under the same delivery id. Handler
// turns that into effectively-once processing for a receiver that keeps
// its Dedup window longer than cdcout's retry horizon; a receiver that
// must survive its own restarts stores the ids it processed with its
// effects instead (Dedup is in memory).
//
// The package depends on the standard library only.
package consumer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far a webhook-timestamp may be from the
// receiver's clock, as the Standard Webhooks spec recommends: a captured
// request cannot be replayed later than this.
const DefaultTolerance = 5 * time.Minute

// Signature errors. Verify wraps them with the detail.
var (
	ErrNoSignature  = errors.New("webhook not signed")
	ErrBadSignature = errors.New("webhook signature does not match")
	ErrTimestamp    = errors.New("webhook timestamp outside the tolerance")
)

// Verifier checks Standard Webhooks signatures
// (https://www.standardwebhooks.com): webhook-signature holds one or more
// space-separated "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>".
type Verifier struct {
	keys [][]byte
	// Tolerance bounds |now - webhook-timestamp|; 0 means DefaultTolerance.
	Tolerance time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewVerifier takes the secrets configured on cdcout's sink, as written
// there: "whsec_<base64>" is base64-decoded, anything else is used as raw
// bytes. Several secrets are accepted at once so that a secret can be
// rotated: give the receiver the new one next to the old one, then
// change cdcout's sink.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("consumer: no webhook secret")
	}
	v := &Verifier{}
	for i, s := range secrets {
		key := []byte(s)
		if rest, ok := strings.CutPrefix(s, "whsec_"); ok {
			var err error
			if key, err = base64.StdEncoding.DecodeString(rest); err != nil {
				return nil, fmt.Errorf("consumer: secret %d starts with whsec_ but the rest is not base64", i)
			}
		}
		if len(key) == 0 {
			return nil, fmt.Errorf("consumer: secret %d is empty", i)
		}
		v.keys = append(v.keys, key)
	}
	return v, nil
}

// Verify checks the request's webhook-id, webhook-timestamp and
// webhook-signature headers against body (the raw bytes, before any
// parsing). The error never holds a secret or an expected signature.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("%w: want webhook-id, webhook-timestamp and webhook-signature headers", ErrNoSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: webhook-timestamp %q is not unix seconds", ErrTimestamp, ts)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	tol := v.Tolerance
	if tol <= 0 {
		tol = DefaultTolerance
	}
	if d := now().Sub(time.Unix(sec, 0)); d > tol || d < -tol {
		return fmt.Errorf("%w: %s off the receiver's clock (tolerance %s)", ErrTimestamp, d.Round(time.Second), tol)
	}
	for _, key := range v.keys {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		want := mac.Sum(nil)
		for _, sig := range strings.Fields(sigs) {
			b64, ok := strings.CutPrefix(sig, "v1,")
			if !ok {
				continue // another scheme (v1a, a future version)
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w (webhook-id %s): is the receiver's secret the sink's?", ErrBadSignature, id)
}
