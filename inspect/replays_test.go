package inspect

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// post sends body to url with the Authorization header auth ("" none).
func post(t *testing.T, url, auth, body string) (int, string) {
	t.Helper()
	return send(t, "POST", url, auth, body)
}

// TestAdminReplay: the replay endpoint is off (403) without a token,
// refuses a missing or wrong token (401), and with the right one checks
// the body and the sink before it records anything.
func TestAdminReplay(t *testing.T) {
	deps := testDeps(t)
	body := `{"from": "0-1-1", "to": "0-1-5"}`
	off := httptest.NewServer(New(Config{}, deps).Handler())
	defer off.Close()
	if code, out := post(t, off.URL+"/v1/sinks/hook/replay", "Bearer "+adminToken, body); code != http.StatusForbidden || !strings.Contains(out, "--admin-token") {
		t.Errorf("without a token configured: %d %s, want 403 naming --admin-token", code, out)
	}
	hs := httptest.NewServer(New(Config{Admin: AdminConfig{Token: adminToken}}, deps).Handler())
	defer hs.Close()
	url := hs.URL + "/v1/sinks/hook/replay"
	for _, auth := range []string{"", "Bearer wrong-token-of-some-length", "Bearer " + adminToken + "x"} {
		if code, out := post(t, url, auth, body); code != http.StatusUnauthorized {
			t.Errorf("auth %q: %d %s, want 401", auth, code, out)
		}
	}
	bearer := "Bearer " + adminToken
	for _, tc := range []struct {
		url, body string
		code      int
		want      string
	}{
		{url, `not json`, http.StatusBadRequest, `want a JSON body`},
		{url, `{"from": "yesterday"}`, http.StatusBadRequest, `--from: \"yesterday\" is not a GTID`},
		{url, `{"from": "0-1-9", "to": "2026-12-01T00:00:00Z"}`, http.StatusBadRequest, `give both as the same kind`},
		{url, `{"from": "0-1-9", "to": "1-1-12"}`, http.StatusBadRequest, `different GTID sources`},
		{hs.URL + "/v1/sinks/hooks/replay", body, http.StatusNotFound, `instance inst has no sink \"hooks\"`},
	} {
		if code, out := post(t, tc.url, bearer, tc.body); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", tc.url, tc.body, code, out, tc.code, tc.want)
		}
	}
	var n int
	if err := deps.DB.QueryRow("SELECT COUNT(*) FROM `" + deps.Schema + "`.replays").Scan(&n); err != nil || n != 0 {
		t.Fatalf("replays recorded by refused requests: %d, %v", n, err)
	}
}
