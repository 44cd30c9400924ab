package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const adminTok = "tok-0123456789abcdef-SECRET"

func TestAdminSettings(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, empty := file("tok", adminTok+"\n"), file("empty", "\n")
	for _, tc := range []struct {
		name    string
		env     map[string]string
		flags   []Setting
		token   string // AdminTokenValue on success
		wantErr string // a field path and message part
	}{
		{name: "off by default"},
		{name: "env", env: map[string]string{"CDCOUT_ADMIN_TOKEN": adminTok}, token: adminTok},
		{name: "file, newline trimmed", flags: []Setting{{"admin-token-file", good}}, token: adminTok},
		{name: "env file", env: map[string]string{"CDCOUT_ADMIN_TOKEN_FILE": good, "CDCOUT_ADMIN_ADDR": "127.0.0.1:9090"}, token: adminTok},
		{name: "both", flags: []Setting{{"admin-token", adminTok}, {"admin-token-file", good}}, wantErr: "admin_token_file: set admin_token or admin_token_file, not both"},
		{name: "missing file", flags: []Setting{{"admin-token-file", filepath.Join(dir, "nope")}}, wantErr: "admin_token_file: " + filepath.Join(dir, "nope") + " does not exist"},
		{name: "empty file", flags: []Setting{{"admin-token-file", empty}}, wantErr: "admin_token_file: " + empty + " is empty"},
		{name: "short", flags: []Setting{{"admin-token", "short" + "SECRET"}}, wantErr: "admin_token: the token is 11 characters long; use at least 16"},
		{name: "whitespace", flags: []Setting{{"admin-token", "abcdefgh ijklmnopSECRET"}}, wantErr: "admin_token: the token contains whitespace"},
		{name: "addr without token", flags: []Setting{{"admin-addr", "127.0.0.1:9090"}}, wantErr: "admin_addr: serves the admin API, which needs admin_token"},
		{name: "bad addr", flags: []Setting{{"admin-token", adminTok}, {"admin-addr", "9090"}}, wantErr: `admin_addr: "9090" is not host:port`},
		{name: "addr is http addr", flags: []Setting{{"admin-token", adminTok}, {"admin-addr", "127.0.0.1:8080"}}, wantErr: "admin_addr: \"127.0.0.1:8080\" is http_addr too"},
		{name: "read auth without token", flags: []Setting{{"admin-read-auth", "true"}}, wantErr: "admin_read_auth: puts the read endpoints behind the admin token, which needs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := append([]Setting{{"dsn", goodDSN}, {"sink", "stdout:"}}, tc.flags...)
			cfg, err := Load(Sources{Flags: flags, Env: envOf(tc.env)})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "SECRET") {
					t.Fatalf("error quotes the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.AdminTokenValue().Value(); got != tc.token {
				t.Fatalf("token = %q, want %q", got, tc.token)
			}
		})
	}
}
