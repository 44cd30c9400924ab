package engine

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/outbox"
)

// TestMessageKeyAndColumnTemplates runs the engine against MariaDB/MySQL
// into kfake and an embedded JetStream: Kafka records carry the key:
// column as their record key and go to the topic the {col:region}
// template names (an update that moves a row to another region follows
// it; a delete is routed by its before image); NATS subjects carry {key}
// and a column. A table created later without the key column gets its
// records dead-lettered with the reason while the others flow.
func TestMessageKeyAndColumnTemplates(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders.eu", "orders.us"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	ns := sinktest.RunNATS(t, nil)
	st := sinktest.AddStream(t, ns.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	s := newSource(t, "mkey", "id INT PRIMARY KEY, customer INT, region VARCHAR(8), email VARCHAR(64)", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{
			{Name: "k", URL: "kafka://" + strings.Join(kc.ListenAddrs(), ",") + "/orders.{col:region}", Key: []string{"customer"}},
			{Name: "n", URL: ns.ClientURL() + "/cdc.{table}.{key}.{col:region}", Key: []string{"customer", "region"}},
		}
	})
	// A config naming a column the table lacks does not start.
	bad := *s.cfg
	bad.Sinks = []config.Sink{{Name: "bad", URL: "kafka://" + kc.ListenAddrs()[0] + "/x", Key: []string{"custmer"}}}
	bad.FillSinkDefaults()
	e, err := New(&bad, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = e.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), `sinks[0] (bad).key: column "custmer" is not a column of `+s.src+".t") {
		t.Fatalf("start with an unknown key column: %v", err)
	}

	runEngine(t, s.cfg, nil)
	exec := func(q string) {
		t.Helper()
		if _, err := s.db.Exec(strings.ReplaceAll(q, "{db}", "`"+s.src+"`")); err != nil {
			t.Fatal(err)
		}
	}
	exec("INSERT INTO {db}.t VALUES (1, 7, 'eu', 'a@x'), (2, 7, 'us', 'b@x'), (3, 8, 'eu', 'c@x')")
	exec("UPDATE {db}.t SET region = 'us' WHERE id = 1")
	exec("DELETE FROM {db}.t WHERE id = 3")
	// Created after the start (the engine runs once it delivered t's
	// changes): no customer column. Its records cannot be keyed and are
	// dead-lettered; t's later change still goes out.
	wait.Until(t, "nats gets t's first records", 30*time.Second, func() bool {
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs >= 5
	})
	exec("CREATE TABLE {db}.other (id INT PRIMARY KEY, region VARCHAR(8))")
	exec("INSERT INTO {db}.other VALUES (1, 'eu')")
	exec("INSERT INTO {db}.t VALUES (4, 9, 'eu', 'd@x')")

	type got struct{ topic, key, op string }
	want := []got{
		{"orders.eu", `{"customer":7}`, "c"}, {"orders.us", `{"customer":7}`, "c"}, {"orders.eu", `{"customer":8}`, "c"},
		{"orders.us", `{"customer":7}`, "u"}, {"orders.eu", `{"customer":8}`, "d"}, {"orders.eu", `{"customer":9}`, "c"},
	}
	recs := sinktest.ConsumeKafka(t, kc, 30*time.Second, len(want), "orders.eu", "orders.us")
	byOp := map[got]int{}
	for _, r := range recs {
		var env struct{ Op string }
		if err := json.Unmarshal(r.Value, &env); err != nil {
			t.Fatal(err)
		}
		byOp[got{r.Topic, string(r.Key), env.Op}]++
	}
	for _, w := range want {
		if byOp[w] != 1 {
			t.Errorf("kafka: %d records on %s with key %s op %s, want 1 (got %v)", byOp[w], w.topic, w.key, w.op, byOp)
		}
	}

	wantSubjects := []string{"cdc.t.7.eu.eu", "cdc.t.7.us.us", "cdc.t.8.eu.eu", "cdc.t.7.us.us", "cdc.t.8.eu.eu", "cdc.t.9.eu.eu"}
	wait.Until(t, "nats gets t's records", 30*time.Second, func() bool {
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs >= uint64(len(wantSubjects))
	})
	subjects := map[string]int{}
	for seq := uint64(1); seq <= uint64(len(wantSubjects)); seq++ {
		m, err := st.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		subjects[m.Subject]++
	}
	for _, w := range wantSubjects {
		subjects[w]--
	}
	for subj, n := range subjects {
		if n != 0 {
			t.Errorf("nats subject %s: %+d messages against the expected", subj, n)
		}
	}

	// other's record is dead on both sinks, with the column named.
	wait.Until(t, "other's records are dead-lettered", 30*time.Second, func() bool {
		n := 0
		for _, r := range records(t, s.db, s.stateDB, "mkey:"+s.src+".other:%") {
			if r.Status == "dead" {
				n++
			}
		}
		return n == 2
	})
	dead, err := outbox.NewStore(s.db, s.stateDB, nil).DeadRows(context.Background(), outbox.DeadQuery{Pipe: "mkey:" + s.src + ".other:k"})
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead rows of other:k: %v, %v", dead, err)
	}
	if want := `column "customer" of the sink's key is not in this row of ` + s.src + `.other`; !strings.Contains(dead[0].LastError, want) {
		t.Errorf("dead reason %q does not say %q", dead[0].LastError, want)
	}
}

// TestColumnTemplateNeedsRows: a {col:…} template is refused on a sink
// that also takes records without a row (heartbeats, transactions, schema
// changes), naming the template; without them it is accepted.
func TestColumnTemplateNeedsRows(t *testing.T) {
	base := config.Sink{Name: "k", URL: "kafka://127.0.0.1:9092/orders.{col:region}"}
	if _, cols, err := rowColumns(base); err != nil || len(cols) != 1 || cols[0] != "region" {
		t.Fatalf("rowColumns(plain) = %v, %v; want [region]", cols, err)
	}
	for name, set := range map[string]func(*config.Sink){
		"heartbeat":    func(s *config.Sink) { s.Heartbeat = time.Second },
		"transactions": func(s *config.Sink) { s.Transactions = true },
		"ddl":          func(s *config.Sink) { s.DDL = true },
	} {
		sc := base
		set(&sc)
		if _, _, err := rowColumns(sc); err == nil || !strings.Contains(err.Error(), "orders.{col:region}") {
			t.Errorf("%s: rowColumns = %v, want the template refused", name, err)
		}
	}
}
