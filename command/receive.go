package command

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
)

// receiveCommand is a small webhook receiver for demos and debugging: it
// prints every delivery it gets as one line on stdout and, with a secret,
// checks the Standard Webhooks signature first.
func receiveCommand() *cli.Command {
	return &cli.Command{
		Name:  "receive",
		Usage: "run a webhook receiver that prints each delivered change (demo and debugging)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:9000", Usage: "listen address"},
			&cli.StringFlag{Name: "secret", EnvVars: []string{"CDCOUT_RECEIVE_SECRET"}, Usage: "Standard Webhooks secret (whsec_… or raw); unsigned or badly signed requests get 401"},
		},
		Action: func(c *cli.Context) error {
			secret, err := webhookSecretBytes(c.String("secret"))
			if err != nil {
				return ConfigErrorf("--secret: %v", err)
			}
			ln, err := net.Listen("tcp", c.String("addr"))
			if err != nil {
				return ConfigErrorf("--addr: %v", err)
			}
			fmt.Fprintf(c.App.ErrWriter, "cdcout receive: listening on %s\n", ln.Addr())
			r := &receiver{out: c.App.Writer, secret: secret}
			return serveUntilDone(c.Context, ln, r)
		},
	}
}

type receiver struct {
	mu     sync.Mutex
	out    io.Writer
	secret []byte
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/healthz" {
		w.WriteHeader(http.StatusOK)
		return
	}
	if req.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	if r.secret != nil && !verifyStandardWebhook(r.secret, req.Header, body) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	r.mu.Lock()
	fmt.Fprintf(r.out, "%s\n", bytes.TrimSpace(body))
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// verifyStandardWebhook checks webhook-signature against
// HMAC-SHA256(secret, "<webhook-id>.<webhook-timestamp>.<body>").
func verifyStandardWebhook(secret []byte, h http.Header, body []byte) bool {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	if id == "" || ts == "" {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if v, ok := strings.CutPrefix(sig, "v1,"); ok && hmac.Equal([]byte(v), []byte(want)) {
			return true
		}
	}
	return false
}

// webhookSecretBytes decodes a Standard Webhooks secret: "whsec_<base64>",
// or any other string taken as raw bytes. "" means no secret.
func webhookSecretBytes(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	if b64, ok := strings.CutPrefix(s, "whsec_"); ok {
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, errors.New("whsec_ secret is not valid base64")
		}
		return b, nil
	}
	return []byte(s), nil
}

// serveUntilDone serves h on ln until ctx ends, then shuts down gracefully.
func serveUntilDone(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	<-errc
	return nil
}

// probeCommand is a health check for images without curl: it GETs a URL
// and exits 0 on a 2xx answer.
func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      "probe",
		Usage:     "GET a URL and exit 0 on 2xx (container health checks)",
		ArgsUsage: "URL",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return ConfigErrorf("probe: want exactly one URL")
			}
			ctx, cancel := context.WithTimeout(c.Context, 3*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Args().First(), nil)
			if err != nil {
				return ConfigErrorf("probe: %v", err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				return fmt.Errorf("probe: %s: %s", resp.Status, strings.TrimSpace(string(body)))
			}
			return nil
		},
	}
}
