package config

import "testing"

// TestRedactText: passwords go by the structure they are written in, never
// by a substring search of the message, so a short password cannot
// mangle it; long secret values go wherever they appear.
func TestRedactText(t *testing.T) {
	long := "whsec_c2VjcmV0c2VjcmV0c2VjcmV0"
	for _, tc := range []struct{ in, want string }{
		{`connect to state database: Error 1045 (28000): Access denied for user 'u'@'localhost' (using password: YES)`,
			`connect to state database: Error 1045 (28000): Access denied for user 'u'@'localhost' (using password: YES)`},
		{`parse "u:e@tcp(h:3306)/db": bad`, `parse "u:[redacted]@tcp(h:3306)/db": bad`},
		{`dsn u:p@ss:w@rd@tcp(h:3306)/db?x=1 refused`, `dsn u:[redacted]@tcp(h:3306)/db?x=1 refused`},
		{`dsn=root:e@unix(/run/my.sock)/`, `dsn=root:[redacted]@unix(/run/my.sock)/`},
		{`dsn root:e@/cdcout`, `dsn root:[redacted]@/cdcout`},
		{`POST https://alice:e@hooks.example/x: 500`, `POST https://alice:[redacted]@hooks.example/x: 500`},
		{`nats://tok:sekrit@n1:4222 down`, `nats://tok:[redacted]@n1:4222 down`},
		{`time 12:30 at host:3306, user@host`, `time 12:30 at host:3306, user@host`},
		{`signature with ` + long + ` rejected`, `signature with [redacted] rejected`},
		{`the e in every word stays`, `the e in every word stays`},
		{`{"url":"http://h:8080/x","by":"a@b"}`, `{"url":"http://h:8080/x","by":"a@b"}`},
		{`{"connected":true,"dsn":"root@tcp(127.0.0.1:3306)/"}`, `{"connected":true,"dsn":"root@tcp(127.0.0.1:3306)/"}`},
		{`{"ok":true,"dsn":"root:e@tcp(127.0.0.1:3306)/"}`, `{"ok":true,"dsn":"root:[redacted]@tcp(127.0.0.1:3306)/"}`},
	} {
		if got := RedactText(tc.in, long, "e"); got != tc.want {
			t.Errorf("RedactText(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}
