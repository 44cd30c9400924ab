package state

import (
	"fmt"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestOpenSessionSettings(t *testing.T) {
	s := mysqltest.Shared(t)
	user := "st_open_user"
	s.Exec(t,
		"CREATE USER IF NOT EXISTS '"+user+"'@'%' IDENTIFIED BY 'pw'",
		"GRANT SELECT ON *.* TO '"+user+"'@'%'")

	for _, tc := range []struct {
		name        string
		dsn         string
		wantMinimal bool
	}{
		{"privileged", s.DSN, true},
		{"unprivileged", fmt.Sprintf("%s:pw@tcp(127.0.0.1:%d)/", user, s.Port), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Open(tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var tz, image string
			if err := p.QueryRow("SELECT @@session.time_zone, @@session.binlog_row_image").Scan(&tz, &image); err != nil {
				t.Fatal(err)
			}
			if tz != "+00:00" {
				t.Errorf("session time_zone = %q, want +00:00", tz)
			}
			if got := p.MinimalRowImage(); got != tc.wantMinimal {
				t.Errorf("MinimalRowImage() = %v, want %v", got, tc.wantMinimal)
			}
			if want := map[bool]string{true: "MINIMAL", false: "FULL"}[tc.wantMinimal]; image != want {
				t.Errorf("session binlog_row_image = %q, want %q", image, want)
			}
		})
	}
}
