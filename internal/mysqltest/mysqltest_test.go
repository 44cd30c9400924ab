package mysqltest

import (
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
