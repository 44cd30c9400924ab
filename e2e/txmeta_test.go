package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// txLine is what TestTransactionRecords reads of each record.
type txLine struct {
	line      int    // of the id's first appearance in the file
	ID        string `json:"id"`
	ChangeKey string `json:"change_key"`
	Op        string `json:"op"`
	Source    struct {
		Table string `json:"table"`
		GTID  string `json:"gtid"`
		Tx    *struct {
			ID         string `json:"id"`
			TotalOrder int    `json:"total_order"`
			TableOrder int    `json:"table_order"`
		} `json:"tx"`
	} `json:"source"`
	Tx *struct {
		ID              string `json:"id"`
		Status          string `json:"status"`
		EventCount      int    `json:"event_count"`
		DataCollections []struct {
			DataCollection string `json:"data_collection"`
			EventCount     int    `json:"event_count"`
		} `json:"data_collections"`
	} `json:"tx"`
}

// TestTransactionRecords: a file sink with transactions: true, 1,000
// random transactions over two tables (some of 30 changes, written in
// parts), `cdcout run` SIGKILLed five times meanwhile. Every transaction
// gets exactly one BEGIN and one END record (one id each: no duplicate
// records, however often the file got them), the END first written after
// every change of its transaction was and the BEGIN before any of them
// (first lines: a redelivery after a SIGKILL repeats lines), END's counts
// equal the changes carrying the transaction's id in source.tx, whose
// total_order and table_order number them 1…n without gaps, and the
// transactions and changes are exactly those the writer committed. In
// both identity modes: the transaction records' keys do not depend on it.
func TestTransactionRecords(t *testing.T) {
	inBothModes(t, testTransactionRecords)
}

func testTransactionRecords(t *testing.T, mode string) {
	const txs, kills = 1000, 5
	srv := mysqltest.Shared(t)
	db, src, stateDB, from := writerSource(t, srv, "e2e_txmeta_"+mode, "a", "b")
	dir := t.TempDir()
	outFile := filepath.Join(dir, "out.jsonl")
	cfgPath := filepath.Join(dir, "cdcout.yaml")
	cfg := fmt.Sprintf(`instance: txmeta
replica_id: e2e-txmeta
`+killedOften+`sinks:
  - name: file
    url: file://%s
    format: native # the stored envelopes: op "tx" records, source.tx on changes
    transactions: true
    timeout: 2s
    batch_size: 32
`, outFile)
	args := runConfig(t, cfgPath, cfg, srv.DSN, stateDB, src, from, mode)
	log := newLogFile(t, "txmeta-"+mode)

	w := &writer{db: db, tables: []string{"`" + src + "`.a", "`" + src + "`.b"}, keys: 40}
	loaded := make(chan error, 1)
	go func() { loaded <- w.transactions(txs) }()
	var werr error
	writerDone := false
	waitWriter := func() {
		if !writerDone {
			werr, writerDone = <-loaded, true
		}
	}
	defer waitWriter()

	for range kills {
		p := startCdcout(t, log, args...)
		time.Sleep(time.Duration(700+rand.IntN(1500)) * time.Millisecond)
		if p.exited() {
			t.Fatalf("cdcout exited on its own: %v\n%s", p.err, log.tail(30))
		}
		p.kill()
	}
	last := startCdcout(t, log, args...)
	waitWriter()
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	wantTx, wantChanges := int(w.txs.Load()), int(w.changes.Load())

	// byID drops the file's redeliveries (same id).
	var (
		byID map[string]txLine
		torn int
	)
	waitFor(t, 90*time.Second, func() (bool, string) {
		if last.exited() {
			t.Fatalf("the last cdcout exited on its own: %v\n%s", last.err, log.tail(30))
		}
		byID, torn = readTxLines(t, outFile)
		ends, changes := 0, 0
		for _, l := range byID {
			switch {
			case l.Op == "tx" && l.Tx != nil && l.Tx.Status == "END":
				ends++
			case l.Op != "tx":
				changes++
			}
		}
		return ends >= wantTx && changes >= wantChanges, fmt.Sprintf("%d END records (want %d), %d changes (want %d)", ends, wantTx, changes, wantChanges)
	})
	if code := last.stop(20 * time.Second); code != 0 {
		t.Fatalf("last cdcout exited %d", code)
	}
	if torn > kills {
		t.Errorf("%d torn lines in the file, more than the %d SIGKILLs can tear", torn, kills)
	}

	type txView struct {
		begins, ends []txLine
		changes      []txLine
	}
	txsSeen := map[string]*txView{}
	view := func(id string) *txView {
		if txsSeen[id] == nil {
			txsSeen[id] = &txView{}
		}
		return txsSeen[id]
	}
	keys := map[string]string{} // change_key → id: one record per change
	for id, l := range byID {
		if prev, dup := keys[l.ChangeKey]; dup {
			t.Errorf("change key %s in two records (%s, %s): a duplicate", l.ChangeKey, prev, id)
		}
		keys[l.ChangeKey] = id
		switch {
		case l.Op == "tx" && l.Tx != nil && l.Tx.Status == "BEGIN":
			view(l.Tx.ID).begins = append(view(l.Tx.ID).begins, l)
		case l.Op == "tx" && l.Tx != nil && l.Tx.Status == "END":
			view(l.Tx.ID).ends = append(view(l.Tx.ID).ends, l)
		case l.Source.Tx == nil:
			t.Errorf("change %s without source.tx", l.ChangeKey)
		default:
			if l.Source.Tx.ID != l.Source.GTID {
				t.Errorf("change %s: source.tx.id %q, want its GTID %q", l.ChangeKey, l.Source.Tx.ID, l.Source.GTID)
			}
			view(l.Source.Tx.ID).changes = append(view(l.Source.Tx.ID).changes, l)
		}
	}
	if len(txsSeen) != wantTx {
		t.Errorf("%d transactions in the records, the writer committed %d", len(txsSeen), wantTx)
	}
	total := 0
	for id, v := range txsSeen {
		total += len(v.changes)
		if len(v.begins) != 1 || len(v.ends) != 1 {
			t.Errorf("transaction %s: %d BEGIN and %d END records, want one each", id, len(v.begins), len(v.ends))
			continue
		}
		end := v.ends[0].Tx
		perTable := map[string][]int{}
		var orders []int
		for _, c := range v.changes {
			orders = append(orders, c.Source.Tx.TotalOrder)
			perTable[src+"."+c.Source.Table] = append(perTable[src+"."+c.Source.Table], c.Source.Tx.TableOrder)
		}
		first, last := v.begins[0].line, 0
		for _, c := range v.changes {
			first, last = min(first, c.line), max(last, c.line)
		}
		if v.begins[0].line > first {
			t.Errorf("transaction %s: BEGIN at line %d, after its change at line %d", id, v.begins[0].line, first)
		}
		if v.ends[0].line < last {
			t.Errorf("transaction %s: END at line %d, before its change at line %d", id, v.ends[0].line, last)
		}
		if end.EventCount != len(v.changes) || !isOneToN(orders) {
			t.Errorf("transaction %s: END counts %d, %d changes carry its id with total_order %v", id, end.EventCount, len(v.changes), orders)
		}
		if len(end.DataCollections) != len(perTable) {
			t.Errorf("transaction %s: END names %d tables, its changes touch %d", id, len(end.DataCollections), len(perTable))
		}
		for _, dc := range end.DataCollections {
			if got := perTable[dc.DataCollection]; dc.EventCount != len(got) || !isOneToN(got) {
				t.Errorf("transaction %s, %s: END counts %d, changes have table_order %v", id, dc.DataCollection, dc.EventCount, got)
			}
		}
	}
	if total != wantChanges {
		t.Errorf("%d changes in the records, the writer committed %d", total, wantChanges)
	}
	t.Logf("%s: %d transactions, %d changes, %d SIGKILLs, %d torn lines: every transaction bracketed once, counts match", mode, wantTx, wantChanges, kills, torn)
}

// isOneToN reports whether ns is a permutation of 1…len(ns).
func isOneToN(ns []int) bool {
	s := append([]int(nil), ns...)
	sort.Ints(s)
	for i, n := range s {
		if n != i+1 {
			return false
		}
	}
	return true
}

// readTxLines reads the file sink's records by id (a redelivery repeats
// an id; it is counted once, at its first line) and counts the lines a
// SIGKILL tore.
func readTxLines(t *testing.T, path string) (out map[string]txLine, torn int) {
	t.Helper()
	out = map[string]txLine{}
	n := 0
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l txLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.ID == "" {
			torn++
			continue
		}
		n++
		if _, again := out[l.ID]; !again {
			l.line = n
			out[l.ID] = l
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out, torn
}

// transactions commits n random transactions of 2–6 changes (3 % of 30,
// written in parts) over w's tables.
func (w *writer) transactions(n int64) error {
	w.rows = make([]map[int]bool, len(w.tables))
	for i := range w.rows {
		w.rows[i] = map[int]bool{}
	}
	for w.txs.Load() < n {
		size := 2 + rand.IntN(5)
		if rand.IntN(100) < 3 {
			size = 30 // above enqueue_max_buffer's share: written in parts
		}
		if err := w.tx(size); err != nil {
			return err
		}
		time.Sleep(time.Duration(2+rand.IntN(6)) * time.Millisecond)
	}
	return nil
}
