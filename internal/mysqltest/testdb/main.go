// Command testdb starts a throwaway server with the binary log on (as the
// tests do), prints its DSN and runs until interrupted. `make db` starts
// MariaDB; `make db FLAVOR=mysql` (CDCOUT_TEST_FLAVOR=mysql) Oracle MySQL.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func main() {
	s, err := mysqltest.StartServer(mysqltest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testdb:", err)
		os.Exit(1)
	}
	defer s.Stop()
	fmt.Printf("%s with binlog=ROW is up.\nDSN: %s\nshell: mariadb -h 127.0.0.1 -P %d -u root\nCtrl-C stops it and deletes its data.\n", s.Flavor, s.DSN, s.Port)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
