package mysqltest

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) { RunMain(m) }

func TestSharedServerHasRowBinlog(t *testing.T) {
	s := Shared(t)
	db := s.Open(t)
	for name, want := range map[string]string{
		"log_bin":             "1",
		"binlog_format":       "ROW",
		"binlog_row_image":    "FULL",
		"binlog_row_metadata": "FULL",
	} {
		var got string
		if err := db.QueryRow("SELECT @@" + name).Scan(&got); err != nil {
			t.Fatalf("select @@%s: %v", name, err)
		}
		if got != want {
			t.Errorf("@@%s = %q, want %q", name, got, want)
		}
	}
	dbName := s.CreateDB(t, "mt")
	s.Exec(t, "CREATE TABLE `"+dbName+"`.t (id INT PRIMARY KEY)", "INSERT INTO `"+dbName+"`.t VALUES (1)")
}

func TestRestartKeepsData(t *testing.T) {
	s := Start(t, Options{ServerID: 7})
	s.Exec(t, "CREATE DATABASE r", "CREATE TABLE r.t (id INT PRIMARY KEY)", "INSERT INTO r.t VALUES (1),(2)")
	for name, restart := range map[string]func() error{"crash": s.Restart, "clean": s.RestartClean} {
		if err := restart(); err != nil {
			t.Fatalf("%s restart: %v", name, err)
		}
		var n int
		if err := s.Open(t).QueryRow("SELECT COUNT(*) FROM r.t").Scan(&n); err != nil {
			t.Fatalf("after %s restart: %v", name, err)
		}
		if n != 2 {
			t.Fatalf("rows after %s restart = %d, want 2", name, n)
		}
	}
}

func TestServerIsTheAskedFlavor(t *testing.T) {
	s := Shared(t)
	got, err := detectFlavor(s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if got != s.Flavor {
		t.Fatalf("server reports %s, harness says %s", got, s.Flavor)
	}
	if os.Getenv("CDCOUT_TEST_DSN") == "" && got != testFlavor() {
		t.Fatalf("CDCOUT_TEST_FLAVOR=%s started a %s server", testFlavor(), got)
	}
}

func TestServersHaveDistinctIdentities(t *testing.T) {
	// Two throwaway servers never share a GTID source id: MySQL's is the
	// server_uuid (every server copies one template datadir, so its
	// auto.cnf must go), MariaDB's the server_id Options sets.
	a, b := Start(t, Options{ServerID: 2}), Start(t, Options{ServerID: 3})
	q := "SELECT @@server_id"
	if a.Flavor == MySQL {
		q = "SELECT @@server_uuid"
	}
	var ua, ub string
	if err := a.Open(t).QueryRow(q).Scan(&ua); err != nil {
		t.Fatal(err)
	}
	if err := b.Open(t).QueryRow(q).Scan(&ub); err != nil {
		t.Fatal(err)
	}
	if ua == ub {
		t.Fatalf("%s is %s on both servers", q, ua)
	}
}

func TestSeqAndGTIDHelpers(t *testing.T) {
	s := Shared(t)
	db := s.Open(t)
	name := s.CreateDB(t, "seq")
	s.Exec(t, "CREATE TABLE `"+name+"`.t (id INT PRIMARY KEY)")
	before := s.GTIDExecuted(t)
	s.Exec(t, "INSERT INTO `"+name+"`.t SELECT seq FROM "+Seq(1234))
	var n, min, max int
	if err := db.QueryRow("SELECT COUNT(*), MIN(id), MAX(id) FROM `"+name+"`.t").Scan(&n, &min, &max); err != nil {
		t.Fatal(err)
	}
	if n != 1234 || min != 1 || max != 1234 {
		t.Fatalf("Seq(1234) gave %d rows %d..%d", n, min, max)
	}
	// Rows come in seq order (tests rely on insertion order).
	rows, err := db.Query("SELECT seq FROM " + Seq(1234))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for want := 1; rows.Next(); want++ {
		var got int
		if err := rows.Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("Seq row %d is %d", want, got)
		}
	}
	after := s.GTIDExecuted(t)
	if after == "" || after == before {
		t.Fatalf("GTIDExecuted did not move with a commit: %q -> %q", before, after)
	}
}
