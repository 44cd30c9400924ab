package benchload

import (
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

// Every workload loads on the test flavour with the mix Load promises:
// what is left is the inserts less the deletes, and the updates changed
// rows (Load checks every statement's affected rows itself).
func TestLoad(t *testing.T) {
	srv := mysqltest.Shared(t)
	conn := srv.Open(t)
	for _, w := range []Workload{Narrow, Realistic, JSONHeavy, Wide40} {
		t.Run(w.Name, func(t *testing.T) {
			db := srv.CreateDB(t, "load_"+w.Name)
			if n := Load(t, srv, conn, db, w, 400); n != 400 {
				t.Fatalf("Load made %d changes, want 400", n)
			}
			var left int
			if err := conn.QueryRow("SELECT COUNT(*) FROM `" + db + "`.t").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if want := 240 - 60; left != want {
				t.Fatalf("%d rows left, want %d", left, want)
			}
		})
	}
}
