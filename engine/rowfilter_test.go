package engine

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/outbox"
)

// TestRowFilter: a sink with a filter gets only the changes it is true
// for; the others are claimed and counted but never delivered; a change
// it cannot be evaluated on is dead-lettered with the reason and the
// pipe goes on. A sink without a filter gets everything.
func TestRowFilter(t *testing.T) {
	rcvAll := newReceiver(t)
	h := newHooked(t, "rowfilter", "gtid", func(cfg *config.Config) {
		cfg.Sinks[0].Filter = `op == "d" || after.v >= 10`
		cfg.Sinks = append(cfg.Sinks, config.Sink{Name: "all", URL: rcvAll.srv.URL})
	})
	e, _ := runEngineE(t, h.cfg, zap.NewNop())
	for _, q := range []string{
		"INSERT INTO {t} VALUES (1, 5)",    // false: filtered
		"INSERT INTO {t} VALUES (2, 20)",   // true
		"INSERT INTO {t} VALUES (3, NULL)", // null >= 10 cannot be evaluated: dead
		"DELETE FROM {t} WHERE id = 1",     // true (op d)
		"INSERT INTO {t} VALUES (4, 30)",   // true: the pipe goes on after the dead letter
	} {
		if _, err := h.db.Exec(strings.ReplaceAll(q, "{t}", "`"+h.src+"`.t")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the unfiltered sink gets all five", 30*time.Second, func() bool { return rcvAll.count() == 5 })
	waitFor(t, "the filtered sink gets three", 30*time.Second, func() bool { return h.rcv.count() == 3 })
	h.rcv.mu.Lock()
	var got []string
	for _, d := range h.rcv.order {
		got = append(got, d.op+d.key)
	}
	h.rcv.mu.Unlock()
	sort.Strings(got) // keys are delivered concurrently
	if want := []string{`c{"id":2}`, `c{"id":4}`, `d{"id":1}`}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("filtered sink got %v, want %v", got, want)
	}
	pipe := "rowfilter:" + h.src + ".t:hook"
	dead, err := outbox.NewStore(h.db, h.stateDB, nil).DeadRows(context.Background(), outbox.DeadQuery{Pipe: pipe})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].RowKey != `{"id":3}` || !strings.Contains(dead[0].LastError, "row filter could not be evaluated") ||
		!strings.Contains(dead[0].LastError, "no such overload") {
		t.Fatalf("dead rows of the filtered pipe = %+v, want id 3 with the filter's error", dead)
	}
	// Every change of the pipe is claimed, the filtered one included (one
	// claim per transaction in GTID mode), but only four records exist.
	var claims int
	if err := h.db.QueryRow("SELECT COUNT(*) FROM `"+h.stateDB+"`.claims WHERE pipe = ?", pipe).Scan(&claims); err != nil {
		t.Fatal(err)
	}
	if claims != 5 {
		t.Errorf("claims of the filtered pipe = %d, want 5 (one per change, filtered or not)", claims)
	}
	if n, _ := countRecords(records(t, h.db, h.stateDB, pipe)); n != 4 {
		t.Errorf("records of the filtered pipe = %d, want 4 (3 delivered, 1 dead; none for the filtered change)", n)
	}
	mfs, err := e.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "cdcout_changes_filtered_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var sink, result string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "sink":
					sink = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			counts[sink+"/"+result] = m.GetCounter().GetValue()
		}
	}
	if counts["hook/filtered"] != 1 || counts["hook/error"] != 1 || len(counts) != 2 {
		t.Errorf("cdcout_changes_filtered_total = %v, want hook/filtered 1 and hook/error 1", counts)
	}
}

// TestRowFilterTransactionCounts: with transactions: true and a row
// filter, a change the filter drops takes no place in its transaction
// (source.tx numbers only the sink's changes) and its END does not count
// it; a transaction whose every change is dropped gets no BEGIN or END.
func TestRowFilterTransactionCounts(t *testing.T) {
	h := newHooked(t, "rowfiltertx", "gtid", func(cfg *config.Config) {
		cfg.Sinks[0].Filter = `after.v >= 10`
		cfg.Sinks[0].Transactions = true
		cfg.Sinks[0].Format = "native" // the envelope's id is the webhook id
	})
	runEngineE(t, h.cfg, zap.NewNop())
	tbl := "`" + h.src + "`.t"
	for _, tx := range [][]string{
		{"INSERT INTO " + tbl + " VALUES (1, 5)"}, // all dropped: no BEGIN/END
		{"INSERT INTO " + tbl + " VALUES (2, 5)", "INSERT INTO " + tbl + " VALUES (3, 20)", "INSERT INTO " + tbl + " VALUES (4, 30)"},
	} {
		txn, err := h.db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range tx {
			if _, err := txn.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// BEGIN, two changes, END.
	waitFor(t, "one transaction of two changes", 30*time.Second, func() bool { return h.rcv.count() >= 4 })
	time.Sleep(500 * time.Millisecond) // anything more would be a record of the dropped transaction
	h.rcv.mu.Lock()
	defer h.rcv.mu.Unlock()
	if n := len(h.rcv.order); n != 4 {
		t.Fatalf("got %d records, want 4 (BEGIN, 2 changes, END)", n)
	}
	var orders []string
	for _, d := range h.rcv.order {
		switch d.op {
		case "tx":
			tx, _ := d.body["tx"].(map[string]any)
			if tx["status"] == "END" {
				if n, _ := tx["event_count"].(float64); n != 2 {
					t.Errorf("END event_count = %v, want 2 (the dropped change is not the sink's)", tx["event_count"])
				}
			}
		case "c":
			src, _ := d.body["source"].(map[string]any)
			place, _ := src["tx"].(map[string]any)
			orders = append(orders, fmt.Sprintf("%s:%v", d.key, place["total_order"]))
		default:
			t.Errorf("unexpected record %s %s", d.op, d.key)
		}
	}
	sort.Strings(orders)
	if want := []string{`{"id":3}:1`, `{"id":4}:2`}; fmt.Sprint(orders) != fmt.Sprint(want) {
		t.Errorf("source.tx total_order of the delivered changes = %v, want %v", orders, want)
	}
}
