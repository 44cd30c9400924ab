package e2e

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkTransactions measures how fast a file sink gets small
// transactions — CDCOUT_BENCH_ROWS (default 2,000) of one insert into
// each of two tables, committed before cdcout starts — with
// transactions: true (a BEGIN before and an END after each: changes wait
// for older BEGINs, ENDs for older changes) and without (the cost of the
// ordering for sinks that do not have it). From cdcout holding the
// enqueue lease to the last line in the file.
func BenchmarkTransactions(b *testing.B) {
	for _, tx := range []bool{true, false} {
		b.Run(fmt.Sprintf("transactions=%v", tx), func(b *testing.B) { benchTransactions(b, tx) })
	}
}

func benchTransactions(b *testing.B, transactions bool) {
	txs := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 2000)
	srv := mysqltest.Shared(b)
	for range b.N {
		db, src, stateDB, from := srv.NewSource(b, "bench_tx", "id INT PRIMARY KEY, v INT NOT NULL")
		srv.Exec(b, "CREATE TABLE `"+src+"`.u (id INT PRIMARY KEY, v INT NOT NULL)")
		for i := range txs {
			tx, err := db.Begin()
			if err != nil {
				b.Fatal(err)
			}
			for _, tbl := range []string{"t", "u"} {
				if _, err := tx.Exec("INSERT INTO `"+src+"`."+tbl+" VALUES (?, 0)", i); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		file := &lineCounter{path: filepath.Join(b.TempDir(), "out.jsonl")}
		cfgPath := filepath.Join(b.TempDir(), "cdcout.yaml")
		yaml := fmt.Sprintf("sinks:\n  - name: file\n    url: file://%s\n    transactions: %v\n", file.path, transactions)
		if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
			b.Fatal(err)
		}
		want := 2 * txs
		if transactions {
			want = 4 * txs
		}
		b.ResetTimer()
		db0, _ := srv.CPUTime()
		q0 := questions(b, db)
		p, _ := benchRun(b, srv, stateDB, "tx", "--tables", src+".t,"+src+".u", "--from", from, "--config", cfgPath)
		start := time.Now()
		waitFor(b, 10*time.Minute, func() (bool, string) {
			if p.exited() {
				b.Fatalf("cdcout exited: %v", p.err)
			}
			n := file.count()
			return n >= want, fmt.Sprintf("%d of %d lines", n, want)
		})
		elapsed := time.Since(start)
		b.StopTimer()
		db1, dbOK := srv.CPUTime()
		q1 := questions(b, db)
		cdcCPU, _ := mysqltest.ProcessCPUTime(p.cmd.Process.Pid)
		if code := p.stop(30 * time.Second); code != 0 {
			b.Fatalf("cdcout exit code %d after SIGTERM", code)
		}
		changes := 2 * txs
		b.ReportMetric(float64(txs)/elapsed.Seconds(), "transactions/s")
		b.ReportMetric(float64(cdcCPU.Microseconds())/float64(changes), "cdcout_cpu_us/change")
		if dbOK {
			b.ReportMetric(float64((db1-db0).Microseconds())/float64(changes), "db_cpu_us/change")
		}
		b.ReportMetric(float64(q1-q0)/float64(txs), "statements/transaction")
		b.Logf("%d two-table transactions (transactions: %v) in the file after %s: %.0f transactions/s",
			txs, transactions, elapsed.Round(time.Millisecond), float64(txs)/elapsed.Seconds())
	}
}

// questions is the server's count of statements received (its own
// included: one per call).
func questions(b *testing.B, db *sql.DB) int64 {
	var name string
	var n int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Queries'").Scan(&name, &n); err != nil {
		b.Fatal(err)
	}
	return n
}
