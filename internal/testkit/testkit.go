// Package testkit holds test helpers shared by several packages' tests
// that belong to no one dependency's helper package: it is imported only
// from _test.go files.
package testkit

import (
	"net"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/faultproxy"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// ProxiedDSN returns srv's DSN routed through a fault proxy, which is
// closed when the test ends, so that a test can break the link to the
// server (faultproxy) under the code it tests.
func ProxiedDSN(tb testing.TB, srv *mysqltest.Server) (string, *faultproxy.Proxy) {
	tb.Helper()
	p, err := faultproxy.Start(net.JoinHostPort(srv.Host, strconv.Itoa(srv.Port)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	mc, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	mc.Net, mc.Addr = "tcp", p.Addr()
	return mc.FormatDSN(), p
}
