package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Churn changes random keys of table — a table (id INT PRIMARY KEY, v
// BIGINT, s VARCHAR) holding ids 1..n — until the returned stop: half the
// statements update a row, a fifth delete one, the rest upsert one, over
// ids 1..n+n/5 (so some inserts are new rows), pausing every between
// statements (0: none). The key sequence is seeded, so a test's run is
// repeatable. stop waits for the writer, fails the test if a statement
// failed, and returns how many statements ran; it may be called again.
func Churn(t testing.TB, db *sql.DB, table string, n int, seed uint64, every time.Duration) (stop func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	writes := 0
	go func() {
		rng := rand.New(rand.NewPCG(seed, seed+1))
		var err error
		for ctx.Err() == nil && err == nil {
			id := rng.IntN(n+n/5) + 1
			switch p := rng.IntN(10); {
			case p < 5:
				_, err = db.Exec("UPDATE "+table+" SET v = v + 1000000, s = ? WHERE id = ?", fmt.Sprintf("upd%d", writes), id)
			case p < 7:
				_, err = db.Exec("DELETE FROM "+table+" WHERE id = ?", id)
			default:
				_, err = db.Exec("INSERT INTO "+table+" (id, v, s) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v), s = VALUES(s)",
					id, -int64(writes), fmt.Sprintf("ins%d", writes))
			}
			writes++
			if every > 0 {
				time.Sleep(every)
			}
		}
		done <- err
	}()
	var once sync.Once
	return func() int {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("writer: %v", err)
			}
		})
		return writes
	}
}
