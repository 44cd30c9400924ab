package inspect

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/outbox"
)

// The admin API: endpoints that change state (re-queue dead letters,
// pause a sink, …). They exist only when a bearer token is configured;
// without one they answer 403 saying how to turn them on, so a default
// installation, whose HTTP server listens on loopback without any
// authentication, cannot be changed over HTTP at all.

// AdminConfig configures the admin API.
type AdminConfig struct {
	// Token is the bearer token write requests must carry; "" turns the
	// write endpoints off.
	Token config.Secret
	// Addr, when set, is a listener of its own for the write endpoints
	// (which then are not served on Config.Addr).
	Addr string
	// ReadAuth puts the read endpoints (/v1/*, /metrics) behind the token
	// too; /healthz and /readyz stay open for orchestrators, and so does
	// the dashboard page, which holds no data and sends the token it is
	// given in its URL fragment (/#token=…) with its reads.
	ReadAuth bool
}

// requireToken serves next only to requests carrying
// "Authorization: Bearer <token>"; others get 401 with a
// WWW-Authenticate challenge (RFC 6750). The comparison is of SHA-256
// digests in constant time, so neither the token's bytes nor its length
// can be learned from response timing. The token never appears in a
// response or a log line.
func requireToken(token config.Secret, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token.Value()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cdcout"`)
			writeAdminError(w, http.StatusUnauthorized, "this endpoint needs Authorization: Bearer <admin token>")
			return
		}
		g := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if subtle.ConstantTimeCompare(g[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cdcout", error="invalid_token"`)
			writeAdminError(w, http.StatusUnauthorized, "the bearer token is not the admin token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// writeAdminError writes a fixed message: it is never built from the
// request, so a token sent by mistake is not echoed.
func writeAdminError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(`{"error":"` + msg + `"}` + "\n"))
}

// read registers a read endpoint, behind the token when ReadAuth is set.
func (s *Server) read(pattern string, h http.HandlerFunc) {
	if s.cfg.Admin.ReadAuth && s.cfg.Admin.Token != "" {
		s.mux.Handle(pattern, requireToken(s.cfg.Admin.Token, h))
		return
	}
	s.mux.HandleFunc(pattern, h)
}

// Admin registers a write endpoint of the admin API: behind the token on
// the admin listener (Admin.Addr) or, without one, on the main listener;
// answering 403 with how to turn it on when no token is configured.
// Every state-changing endpoint (backfills included) is registered here.
func (s *Server) Admin(pattern string, h http.HandlerFunc) {
	switch {
	case s.cfg.Admin.Token == "":
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			writeAdminError(w, http.StatusForbidden, "the admin API is off: start cdcout run with --admin-token or --admin-token-file (CDCOUT_ADMIN_TOKEN)")
		})
	case s.cfg.Admin.Addr != "":
		s.adminMux.Handle(pattern, requireToken(s.cfg.Admin.Token, h))
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			writeAdminError(w, http.StatusNotFound, "the admin API is served on the admin address (--admin-addr), not here")
		})
	default:
		s.mux.Handle(pattern, requireToken(s.cfg.Admin.Token, h))
	}
}

func (s *Server) adminRoutes() {
	s.adminMux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		s.writeText(w, http.StatusOK, "ok\n")
	})
	s.Admin("POST /v1/dead/retry", s.retryDead)
	s.controlRoutes()
	s.replayRoutes()
	s.backfillRoutes()
}

// retryDeadView is the POST /v1/dead/retry answer.
type retryDeadView struct {
	Instance string `json:"instance"`
	Requeued int64  `json:"requeued"`
}

// retryDead puts this instance's dead rows back to pending with attempts
// reset, like `cdcout dead retry`: all of them, or those of ?pipe= and/or
// the one ?id=. A pipe of another instance is refused, not ignored.
func (s *Server) retryDead(w http.ResponseWriter, r *http.Request) {
	pipe, id := r.FormValue("pipe"), r.FormValue("id")
	if pipe != "" && !strings.HasPrefix(pipe, s.deps.Instance+":") {
		s.writeJSON(w, http.StatusBadRequest, map[string]string{"error": "pipe " + pipe + " is not one of instance " + s.deps.Instance + "'s (<instance>:<db.table>:<sink>)"})
		return
	}
	pipes := []string{pipe}
	if pipe == "" {
		var err error
		pipes, err = s.reader.store().PipesWithRecords(r.Context(), s.reader.pipePrefix(), outbox.StatusDead)
		if err != nil {
			s.reply(w, nil, err)
			return
		}
	}
	v := retryDeadView{Instance: s.deps.Instance}
	for _, p := range pipes {
		n, err := s.reader.store().RetryDead(r.Context(), p, id)
		if err != nil {
			s.reply(w, nil, err)
			return
		}
		v.Requeued += n
	}
	if id != "" && v.Requeued == 0 {
		s.writeJSON(w, http.StatusNotFound, map[string]string{"error": "no dead row with id " + id + " in instance " + s.deps.Instance})
		return
	}
	s.log.Info("dead rows re-queued over the admin API", zap.String("pipe", pipe), zap.String("id", id), zap.Int64("rows", v.Requeued))
	s.writeJSON(w, http.StatusOK, v)
}
