package inspect

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/control"
)

const adminToken = "adm-7c1f0e2b9a4d4e55-TOKEN"

// do sends method to url with the Authorization header auth ("" none)
// and returns the status and body; no body ever holds the token.
func do(t *testing.T, method, url, auth string) (int, string) {
	t.Helper()
	return send(t, method, url, auth, "")
}

// send is do with a request body.
func send(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), adminToken) {
		t.Fatalf("%s %s: the body holds the admin token: %s", method, url, b)
	}
	return resp.StatusCode, string(b)
}

func deadCount(t *testing.T, db *sql.DB, schema, pipe string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM `"+schema+"`.outbox WHERE status = 'dead' AND pipe = ?", pipe).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAdminAPIOffWithoutToken: with no token the write endpoint exists
// but refuses, saying how to turn it on, and changes nothing.
func TestAdminAPIOffWithoutToken(t *testing.T) {
	deps := testDeps(t)
	hs := httptest.NewServer(New(Config{}, deps).Handler())
	defer hs.Close()
	for _, path := range []string{"/v1/dead/retry", "/v1/backfills"} {
		for _, auth := range []string{"", "Bearer " + adminToken} {
			code, body := do(t, "POST", hs.URL+path, auth)
			if code != http.StatusForbidden || !strings.Contains(body, "--admin-token") {
				t.Errorf("POST %s, auth %q: %d %s, want 403 naming --admin-token", path, auth, code, body)
			}
		}
	}
	// Reading backfills needs no token (read_auth is off).
	if code, body := do(t, "GET", hs.URL+"/v1/backfills", ""); code != http.StatusOK || !strings.Contains(body, `"backfills":[]`) {
		t.Errorf("GET /v1/backfills: %d %s, want 200 with an empty list", code, body)
	}
	if got := deadCount(t, deps.DB, deps.Schema, "inst:shop.orders:hook"); got != 1 {
		t.Fatalf("dead rows = %d, want 1 (untouched)", got)
	}
}

// TestAdminDeadRetry: refused without the token and with a wrong one,
// done with the right one, scoped to the instance.
func TestAdminDeadRetry(t *testing.T) {
	deps := testDeps(t)
	hs := httptest.NewServer(New(Config{Admin: AdminConfig{Token: adminToken}}, deps).Handler())
	defer hs.Close()
	url := hs.URL + "/v1/dead/retry"
	for _, auth := range []string{"", "Bearer", "Bearer wrong-token-of-some-length", "Basic " + adminToken, "Bearer " + adminToken + "x", adminToken} {
		code, body := do(t, "POST", url, auth)
		if code != http.StatusUnauthorized {
			t.Errorf("auth %q: %d %s, want 401", auth, code, body)
		}
	}
	if got := deadCount(t, deps.DB, deps.Schema, "inst:shop.orders:hook"); got != 1 {
		t.Fatalf("dead rows after refused requests = %d, want 1", got)
	}
	bearer := "Bearer " + adminToken
	if code, body := do(t, "POST", url+"?pipe=other:shop.orders:hook", bearer); code != http.StatusBadRequest {
		t.Errorf("another instance's pipe: %d %s, want 400", code, body)
	}
	if code, body := do(t, "POST", url+"?id="+fixtureID(8), bearer); code != http.StatusNotFound {
		t.Errorf("another instance's row by id: %d %s, want 404", code, body)
	}
	if code, body := do(t, "GET", url, bearer); code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d %s, want 405", code, body)
	}
	code, body := do(t, "POST", url, bearer)
	if code != http.StatusOK || !strings.Contains(body, `"requeued":1`) {
		t.Fatalf("with the token: %d %s, want 200 requeued 1", code, body)
	}
	if got := deadCount(t, deps.DB, deps.Schema, "inst:shop.orders:hook"); got != 0 {
		t.Errorf("dead rows of inst = %d, want 0", got)
	}
	if got := deadCount(t, deps.DB, deps.Schema, "other:shop.orders:hook"); got != 1 {
		t.Errorf("dead rows of the other instance = %d, want 1 (not this instance's)", got)
	}
	// Reads stay open without ReadAuth.
	if code, _ := do(t, "GET", hs.URL+"/v1/sinks", ""); code != http.StatusOK {
		t.Errorf("GET /v1/sinks without a token: %d, want 200", code)
	}
}

// TestAdminReadAuth: the reads need the token; health checks and the
// dashboard page do not.
func TestAdminReadAuth(t *testing.T) {
	hs := httptest.NewServer(New(Config{Admin: AdminConfig{Token: adminToken, ReadAuth: true}}, testDeps(t)).Handler())
	defer hs.Close()
	for _, path := range []string{"/v1/sinks", "/v1/source", "/v1/leases", "/v1/fleet", "/v1/dead", "/v1/source/history", "/metrics"} {
		if code, body := do(t, "GET", hs.URL+path, ""); code != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d %s, want 401", path, code, body)
		}
		if code, body := do(t, "GET", hs.URL+path, "Bearer "+adminToken); code != http.StatusOK {
			t.Errorf("GET %s with the token: %d %s, want 200", path, code, body)
		}
	}
	for _, path := range []string{"/healthz", "/"} {
		if code, _ := do(t, "GET", hs.URL+path, ""); code != http.StatusOK {
			t.Errorf("GET %s without a token: %d, want 200", path, code)
		}
	}
}

// TestAdminSeparateListener: with Admin.Addr the writes are served there
// only; the main listener says where they went.
func TestAdminSeparateListener(t *testing.T) {
	deps := testDeps(t)
	s := serve(t, Config{Addr: "127.0.0.1:0", Admin: AdminConfig{Token: adminToken, Addr: "127.0.0.1:0"}}, deps)
	main, admin := "http://"+s.Addr().String(), "http://"+s.AdminAddr().String()
	if code, body := do(t, "POST", main+"/v1/dead/retry", "Bearer "+adminToken); code != http.StatusNotFound || !strings.Contains(body, "--admin-addr") {
		t.Errorf("write on the main listener: %d %s, want 404 naming --admin-addr", code, body)
	}
	if code, _ := do(t, "POST", admin+"/v1/dead/retry", ""); code != http.StatusUnauthorized {
		t.Errorf("admin listener without a token: %d, want 401", code)
	}
	if code, body := do(t, "POST", admin+"/v1/dead/retry", "Bearer "+adminToken); code != http.StatusOK {
		t.Errorf("admin listener with the token: %d %s, want 200", code, body)
	}
	if code, _ := do(t, "GET", admin+"/v1/sinks", ""); code != http.StatusNotFound {
		t.Errorf("reads on the admin listener: %d, want 404 (it serves writes only)", code)
	}
	if got := deadCount(t, deps.DB, deps.Schema, "inst:shop.orders:hook"); got != 0 {
		t.Errorf("dead rows = %d, want 0", got)
	}
}

// TestAdminListenError: a taken admin address fails Run with the address,
// and the main listener it had opened is closed again.
func TestAdminListenError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s := New(Config{Addr: "127.0.0.1:0", Admin: AdminConfig{Token: config.Secret(adminToken), Addr: taken.Addr().String()}}, Deps{})
	err = s.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("listen on %s", taken.Addr())) {
		t.Fatalf("Run = %v, want a listen error naming %s", err, taken.Addr())
	}
	if _, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		t.Errorf("the main listener %s still accepts after the failed start", s.Addr())
	}
}

// TestAdminPauseResume: pause and resume need the token, refuse a sink
// the instance does not have, and /v1/sinks shows the state at once.
func TestAdminPauseResume(t *testing.T) {
	deps := testDeps(t)
	deps.Sinks = []string{"hook", "fresh"}
	hs := httptest.NewServer(New(Config{Admin: AdminConfig{Token: adminToken}}, deps).Handler())
	defer hs.Close()
	bearer := "Bearer " + adminToken
	paused := func() map[string]bool {
		var v sinksView
		getJSON(t, hs.URL+"/v1/sinks", &v)
		out := map[string]bool{}
		for _, p := range v.Pipes {
			out[p.Pipe] = p.Paused
		}
		return out
	}
	if code, _ := do(t, "POST", hs.URL+"/v1/sinks/hook/pause", ""); code != http.StatusUnauthorized {
		t.Fatalf("pause without the token: %d, want 401", code)
	}
	for _, step := range []struct {
		path, want string
		code       int
		paused     bool
	}{
		{"/v1/sinks/hook/pause", `"paused":true,"changed":true`, http.StatusOK, true},
		{"/v1/sinks/hook/pause", `"paused":true,"changed":false`, http.StatusOK, true},
		{"/v1/sinks/nope/pause", `instance inst has no sink \"nope\" (known sinks: fresh, hook)`, http.StatusNotFound, true},
		{"/v1/sinks/fresh/pause", `"sink":"fresh","paused":true,"changed":true`, http.StatusOK, true},
		{"/v1/sinks/hook/resume", `"paused":false,"changed":true`, http.StatusOK, false},
	} {
		code, body := do(t, "POST", hs.URL+step.path, bearer)
		if code != step.code || !strings.Contains(body, step.want) {
			t.Fatalf("POST %s: %d %s, want %d with %s", step.path, code, body, step.code, step.want)
		}
		got := paused()
		if got["inst:shop.orders:hook"] != step.paused || got["inst:shop.users:hook"] != step.paused {
			t.Fatalf("after POST %s: /v1/sinks paused %v, want hook's pipes %v", step.path, got, step.paused)
		}
	}
	states, err := control.List(context.Background(), deps.DB, deps.Schema, "inst")
	if err != nil || len(states) != 2 || states[0].Sink != "fresh" || !states[0].Paused || states[1].Paused || states[1].ChangedBy != "api" || states[1].ChangedAt.IsZero() {
		t.Errorf("control rows of inst = %+v, %v; want fresh paused and hook resumed, by the api", states, err)
	}
	if other, err := control.Paused(context.Background(), deps.DB, deps.Schema, "other"); err != nil || len(other) != 0 {
		t.Errorf("paused sinks of another instance = %v, %v; want none", other, err)
	}
}
