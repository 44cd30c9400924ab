package binlog

import (
	"context"
	"fmt"
	"github.com/cdcout/cdcout/internal/mysqltest"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"
	"testing"
	"time"
)

// TestCreateTableSelect: CREATE TABLE … SELECT is one transaction holding
// the CREATE, its rows and (on MariaDB, and MySQL 8.0.21+'s atomic form,
// "CREATE TABLE … START TRANSACTION") a terminating COMMIT or XID. Its rows
// carry the GTID and change key of that transaction, and no Commit (so no
// checkpoint) falls between the CREATE and its rows: a restart there would
// resume inside the transaction. The SQL is flavour-neutral.
func TestCreateTableSelect(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "ctas")
	srv.Exec(t,
		"CREATE TABLE `"+db+"`.src (id INT PRIMARY KEY, v VARCHAR(10))",
		"INSERT INTO `"+db+"`.src VALUES (1,'a'),(2,'b'),(3,'c')",
	)
	s := openStream(t, testConfig(t, srv, db))
	c := collect(t, s)
	srv.Exec(t,
		"CREATE TABLE `"+db+"`.copy (PRIMARY KEY (id)) SELECT id, v FROM `"+db+"`.src",
		"INSERT INTO `"+db+"`.copy VALUES (4,'d')",
	)
	evs := c.waitChanges(t, 4)
	var lastCommit *Commit
	for i, ev := range evs {
		if ev.Commit != nil {
			lastCommit = ev.Commit
			continue
		}
		ch := ev.Change
		if ch.Source.Table != "copy" {
			t.Fatalf("change of %s", ch.Source.Table)
		}
		if ch.Source.GTID == "" || ch.ChangeKey != fmt.Sprintf("g:%s:%d", ch.Source.GTID, ch.Source.Row) {
			t.Errorf("change %d: gtid %q key %q row %d", i, ch.Source.GTID, ch.ChangeKey, ch.Source.Row)
		}
		if i < 3 {
			if ch.Source.Row != i {
				t.Errorf("change %d: row %d", i, ch.Source.Row)
			}
			if lastCommit != nil && lastCommit.GTID == ch.Source.GTID {
				t.Errorf("change %d: its transaction %s was committed before its row", i, ch.Source.GTID)
			}
		}
	}
	ch := changesOf(evs)
	if ch[0].Source.GTID != ch[2].Source.GTID || ch[3].Source.GTID == ch[0].Source.GTID {
		t.Errorf("gtids %s %s %s %s", ch[0].Source.GTID, ch[1].Source.GTID, ch[2].Source.GTID, ch[3].Source.GTID)
	}
	// The CREATE … SELECT commits once, after its rows, with all of them.
	evs = c.waitFor(t, func(evs []Event) bool {
		for _, ev := range evs {
			if ev.Commit != nil && ev.Commit.GTID == ch[3].Source.GTID {
				return true
			}
		}
		return false
	}, "commit of the insert")
	var commits []*Commit
	seen := 0
	for _, ev := range evs {
		if ev.Change != nil {
			seen++
		}
		if ev.Commit != nil && ev.Commit.GTID == ch[0].Source.GTID {
			commits = append(commits, ev.Commit)
			if seen != 3 {
				t.Errorf("create … select committed after %d of its 3 rows", seen)
			}
		}
	}
	if len(commits) != 1 || commits[0].Rows != 3 {
		t.Fatalf("commits of the create … select: %+v", commits)
	}
}

// TestCreateTableSelectMySQLShape: MySQL 8.0.21+ logs an atomic CREATE
// TABLE … SELECT as a GTID event, "CREATE TABLE … START TRANSACTION", the
// rows and an XID. The throwaway server is MariaDB, so the test takes the
// real parsed events of a MariaDB CREATE … SELECT and reshapes them the way
// MySQL writes them; on a MySQL server TestCreateTableSelect covers the
// real thing. (It reads MariaDB's GTID events, so it is MariaDB-only.)
func TestCreateTableSelectMySQLShape(t *testing.T) {
	srv := mysqltest.Shared(t)
	skipUnlessMariaDB(t, srv)
	db := srv.CreateDB(t, "ctasmy")
	srv.Exec(t,
		"CREATE TABLE `"+db+"`.src (id INT PRIMARY KEY)",
		"INSERT INTO `"+db+"`.src VALUES (1),(2)",
	)
	s := openStream(t, testConfig(t, srv, db))
	var file string
	var pos uint32
	var ignore any
	if err := srv.Open(t).QueryRow("SHOW MASTER STATUS").Scan(&file, &pos, &ignore, &ignore); err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "CREATE TABLE `"+db+"`.copy (PRIMARY KEY (id)) SELECT id FROM `"+db+"`.src")

	scfg, err := s.syncerConfig()
	if err != nil {
		t.Fatal(err)
	}
	syncer := replication.NewBinlogSyncer(scfg)
	defer syncer.Close()
	streamer, err := syncer.StartSync(gomysql.Position{Name: file, Pos: pos})
	if err != nil {
		t.Fatal(err)
	}
	sid := uuid.New()
	var seq []*replication.BinlogEvent
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for done := false; !done; {
		ev, err := streamer.GetEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch e := ev.Event.(type) {
		case *replication.MariadbGTIDEvent:
			// The start position may lie before the CREATE TABLE of src:
			// keep only the last group.
			seq = append(seq[:0], &replication.BinlogEvent{Header: ev.Header, Event: &replication.GTIDEvent{SID: sid[:], GNO: 7}})
			seq[len(seq)-1].Header.EventType = replication.GTID_EVENT
		case *replication.QueryEvent:
			if string(e.Query) == "COMMIT" {
				seq = append(seq, &replication.BinlogEvent{Header: ev.Header, Event: &replication.XIDEvent{XID: 1}})
				done = true
				break
			}
			e.Query = append(e.Query, " START TRANSACTION"...)
			seq = append(seq, ev)
		case *replication.XIDEvent:
			seq = append(seq, ev)
			done = true
		case *replication.TableMapEvent, *replication.RowsEvent:
			seq = append(seq, ev)
		}
	}
	var got []Event
	r := &reader{s: s, resume: startPoint{file: file, pos: pos}, file: file, lastCommit: time.Now(), h: func(_ context.Context, ev Event) error {
		got = append(got, ev)
		return nil
	}}
	for _, ev := range seq {
		if err := r.event(t.Context(), ev, ev.Header); err != nil {
			t.Fatal(err)
		}
	}
	gtid := sid.String() + ":7"
	if len(got) != 3 || got[0].Change == nil || got[1].Change == nil || got[2].Commit == nil {
		t.Fatalf("events %+v, want two changes and a commit", got)
	}
	for i, ev := range got[:2] {
		if ch := ev.Change; ch.Source.GTID != gtid || ch.ChangeKey != fmt.Sprintf("g:%s:%d", gtid, i) {
			t.Errorf("change %d: gtid %q key %q", i, ch.Source.GTID, ch.ChangeKey)
		}
	}
	if c := got[2].Commit; c.Rows != 2 || c.GTID != gtid || c.Pos.Pos != seq[len(seq)-1].Header.LogPos {
		t.Errorf("commit %+v", c)
	}
}
