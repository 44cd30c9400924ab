package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
)

// Backfills over HTTP: GET /v1/backfills lists the backfills and signals;
// POST /v1/backfills (admin API) asks the fleet's leader for one by
// writing a signal, as an INSERT into backfill_signals would.

// BackfillRequest is the body of POST /v1/backfills.
type BackfillRequest struct {
	Table     string   `json:"table"`
	Where     string   `json:"where,omitempty"`
	Sinks     []string `json:"sinks,omitempty"`
	ReadOnly  bool     `json:"read_only,omitempty"`
	ChunkSize int      `json:"chunk_size,omitempty"`
}

// BackfillView is one backfill in /v1/backfills.
type BackfillView struct {
	ID           string    `json:"id"`
	Table        string    `json:"table"`
	Sinks        []string  `json:"sinks"`
	Where        string    `json:"where,omitempty"`
	Status       string    `json:"status"`
	Error        string    `json:"error,omitempty"`
	RowsDone     int64     `json:"rows_done"`
	RowsEstimate int64     `json:"rows_estimate"`
	LastKey      string    `json:"last_key,omitempty"`
	ReadOnly     bool      `json:"read_only"`
	Origin       string    `json:"origin,omitempty"`
	Fleet        bool      `json:"fleet"` // run by the enqueue leader (resumed by the next one)
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// BackfillsView is GET /v1/backfills.
type BackfillsView struct {
	Instance  string            `json:"instance"`
	Backfills []BackfillView    `json:"backfills"`
	Signals   []backfill.Signal `json:"signals"`
}

// signalsShown bounds the signals /v1/backfills lists (newest first).
const signalsShown = 100

func (s *Server) backfillRoutes() {
	s.read("GET /v1/backfills", func(w http.ResponseWriter, r *http.Request) {
		v, err := s.reader.Backfills(r.Context())
		s.reply(w, v, err)
	})
	s.Admin("POST /v1/backfills", s.postBackfill)
}

// Backfills reads the instance's backfills and signals.
func (r Reader) Backfills(ctx context.Context) (BackfillsView, error) {
	v := BackfillsView{Instance: r.Instance, Backfills: []BackfillView{}, Signals: []backfill.Signal{}}
	list, err := backfill.List(ctx, r.DB, r.Schema)
	if err != nil {
		return v, err
	}
	for _, b := range list {
		if b.Instance != r.Instance {
			continue
		}
		v.Backfills = append(v.Backfills, BackfillView{ID: b.ID, Table: b.Table, Sinks: b.Sinks, Where: b.Where, Status: b.Status, Error: b.Error,
			RowsDone: b.RowsDone, RowsEstimate: b.RowsEstimate, LastKey: b.LastKey, ReadOnly: b.ReadOnly, Origin: b.Origin,
			Fleet: b.Owner == backfill.OwnerFleet, CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt})
	}
	sig, err := backfill.Signals(ctx, r.DB, r.Schema, r.Instance, signalsShown)
	if err != nil {
		return v, err
	}
	if sig != nil {
		v.Signals = sig
	}
	return v, nil
}

// postBackfill checks the request (Deps.RequestBackfill: the sinks'
// subscriptions, the table, the WHERE) and answers 202 with the signal it
// wrote; the leader starts the backfill within a second or two.
func (s *Server) postBackfill(w http.ResponseWriter, r *http.Request) {
	if s.deps.RequestBackfill == nil {
		s.writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "this process does not run backfills"})
		return
	}
	var req BackfillRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: want a JSON object {\"table\": \"db.table\", \"where\": …, \"sinks\": […], \"read_only\": …, \"chunk_size\": …}: " + err.Error()})
		return
	}
	g, err := s.deps.RequestBackfill(r.Context(), backfill.Signal{Instance: s.deps.Instance, Table: req.Table, Where: req.Where, Sinks: req.Sinks,
		ReadOnly: req.ReadOnly, ChunkSize: req.ChunkSize})
	switch {
	case errors.Is(err, backfill.ErrBadInput):
		s.writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	case err != nil:
		s.reply(w, nil, err)
		return
	}
	s.log.Info("backfill requested over the admin API", zap.Int64("signal", g.ID), zap.String("table", g.Table))
	s.writeJSON(w, http.StatusAccepted, g)
}
