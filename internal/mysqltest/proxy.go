package mysqltest

import (
	"net"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/faultproxy"
)

// ProxiedDSN returns the server's DSN routed through a fault proxy, which
// is closed when the test ends, so that a test can break the link to the
// server (faultproxy) under the code it tests.
func (s *Server) ProxiedDSN(tb testing.TB) (string, *faultproxy.Proxy) {
	tb.Helper()
	p, err := faultproxy.Start(net.JoinHostPort(s.Host, strconv.Itoa(s.Port)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	mc, err := mysql.ParseDSN(s.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	mc.Net, mc.Addr = "tcp", p.Addr()
	return mc.FormatDSN(), p
}
