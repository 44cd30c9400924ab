package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// DefaultMaxBody bounds a request body Handler reads.
const DefaultMaxBody = 64 << 20

// Handler is an http.Handler for a cdcout webhook sink: it verifies the
// signature (when Verifier is set), decodes the body and calls Process
// once per record not processed before (when Dedup is set), in the
// body's order.
//
// Its answers follow what cdcout does with them: 401 for a bad signature
// and 400 for a body it cannot decode (cdcout dead-letters the record:
// no retry can fix them), 500 when Process fails (cdcout retries; records
// of a batch processed before the failure are then dropped as
// redeliveries), 204 when every record was processed or dropped.
type Handler struct {
	Verifier *Verifier
	Dedup    *Dedup
	Process  func(ctx context.Context, c Change) error
	// MaxBody bounds the body read; 0 means DefaultMaxBody.
	MaxBody int64
	// OnError, when set, is told every error answered (to log it).
	OnError func(r *http.Request, status int, err error)
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status, err := h.serve(r)
	if err != nil {
		if h.OnError != nil {
			h.OnError(r, status, err)
		}
		http.Error(w, err.Error(), status)
		return
	}
	w.WriteHeader(status)
}

func (h *Handler) serve(r *http.Request) (int, error) {
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, errors.New("cdcout webhooks are POSTs")
	}
	limit := h.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return http.StatusBadRequest, fmt.Errorf("read body: %w", err)
	}
	if int64(len(body)) > limit {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", limit)
	}
	if h.Verifier != nil {
		if err := h.Verifier.Verify(r.Header, body); err != nil {
			return http.StatusUnauthorized, err
		}
	}
	changes, err := Decode(body)
	if err != nil {
		return http.StatusBadRequest, err
	}
	if len(changes) == 1 && changes[0].ID == "" {
		changes[0].ID = r.Header.Get("webhook-id") // maxwell carries no id
	}
	for _, c := range changes {
		if err := h.process(r.Context(), c); err != nil {
			return http.StatusInternalServerError, fmt.Errorf("process %s: %w", c.ID, err)
		}
	}
	return http.StatusNoContent, nil
}

func (h *Handler) process(ctx context.Context, c Change) error {
	if h.Dedup == nil || c.ID == "" {
		return h.Process(ctx, c)
	}
	_, err := h.Dedup.Do(c.ID, func() error { return h.Process(ctx, c) })
	return err
}
