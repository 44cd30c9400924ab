package binlog

import (
	"context"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// TestForeignStateNeverCaptured: a database holding cdcout's marker table
// (another installation's state, created after this stream started) is
// never captured even when the patterns include it, and its MINIMAL row
// images do not stop the stream; rows of a captured table written with
// MINIMAL images stop it with an error naming the table, the cause and the
// way out.
func TestForeignStateNeverCaptured(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "mk")
	other := srv.CreateDB(t, "mkother")
	third := srv.CreateDB(t, "mkthird")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE `"+third+"`.t (id INT PRIMARY KEY, v INT)", "INSERT INTO `"+third+"`.t VALUES (1, 1)")
	s := openStream(t, testConfig(t, srv, db, other))
	c := collect(t, s)

	if err := state.CreateMarker(t.Context(), srv.Open(t), other); err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "CREATE TABLE `"+other+"`.checkpoints (id INT PRIMARY KEY, a INT, b INT)",
		"INSERT INTO `"+other+"`.checkpoints VALUES (1, 1, 1)")
	conn, err := srv.Open(t).Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{
		"SET SESSION binlog_row_image = 'MINIMAL'",
		"UPDATE `" + other + "`.checkpoints SET a = 2 WHERE id = 1",
		"SET SESSION binlog_row_image = 'FULL'",
		"INSERT INTO `" + db + "`.t VALUES (1, 1)",
	} {
		if _, err := conn.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	evs := c.waitChanges(t, 1)
	for _, ch := range changesOf(evs) {
		if ch.Source.DB != db {
			t.Fatalf("captured %s.%s", ch.Source.DB, ch.Source.Table)
		}
	}

	// A captured table with a MINIMAL image stops a new stream, with a
	// message that says what to do.
	s2 := openStream(t, testConfig(t, srv, third))
	for _, q := range []string{
		"SET SESSION binlog_row_image = 'MINIMAL'",
		"UPDATE `" + third + "`.t SET v = 2 WHERE id = 1",
		"SET SESSION binlog_row_image = 'FULL'",
	} {
		if _, err := conn.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	err = s2.Run(t.Context(), func(context.Context, Event) error { return nil })
	if err == nil {
		t.Fatal("stream went on past a MINIMAL image")
	}
	for _, want := range []string{third + ".t", "binlog_row_image=MINIMAL", "binlog_row_image=FULL", "--tables", "--reset-position --from now"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}
