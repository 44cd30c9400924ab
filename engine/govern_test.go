package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/sinktest"
)

// bodyReceiver is a webhook receiver that keeps every body it gets.
type bodyReceiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newBodyReceiver(t *testing.T) *bodyReceiver {
	r := &bodyReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies = append(r.bodies, b)
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *bodyReceiver) all() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.bodies...)
}

// delivered is what a sink's message says of a change, whatever its
// format: the op letter, the row id and the images.
type delivered struct {
	op            string
	id            float64
	before, after map[string]any
	old           map[string]any // maxwell only
}

// decodeDelivered reads a message of format f.
func decodeDelivered(t *testing.T, f string, b []byte) delivered {
	t.Helper()
	var d delivered
	switch f {
	case "debezium", "cloudevents":
		if f == "cloudevents" {
			var ce struct {
				Data json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(b, &ce); err != nil || ce.Data == nil {
				t.Fatalf("cloudevent %s: %v", b, err)
			}
			b = ce.Data
		}
		var e struct {
			Op     string         `json:"op"`
			Before map[string]any `json:"before"`
			After  map[string]any `json:"after"`
		}
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("envelope %s: %v", b, err)
		}
		d = delivered{op: e.Op, before: e.Before, after: e.After}
		if img := cmpImg(e.After, e.Before); img != nil {
			d.id, _ = img["id"].(float64)
		}
	case "maxwell":
		var m struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
			Old  map[string]any `json:"old"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("maxwell %s: %v", b, err)
		}
		d.op = map[string]string{"insert": "c", "update": "u", "delete": "d"}[m.Type]
		d.old = m.Old
		if d.op == "d" {
			d.before = m.Data
		} else {
			d.after = m.Data
		}
		d.id, _ = m.Data["id"].(float64)
	}
	return d
}

func cmpImg(a, b map[string]any) map[string]any {
	if a != nil {
		return a
	}
	return b
}

// TestFiltersAndTransformsInEveryFormat runs one filter and the hash,
// mask and include transforms through the real engine from MariaDB/MySQL
// to webhooks in each format (debezium, cloudevents, maxwell) and to
// Kafka (kfake): every sink gets the same three changes — the filtered
// insert in none — with the email hashed (HMAC-SHA256 of its canonical
// JSON under the key), the name masked and the secret column left out.
func TestFiltersAndTransformsInEveryFormat(t *testing.T) {
	const hashKey = "govern-test-hash-key-0123456789"
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "gov"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	formats := []string{"debezium", "cloudevents", "maxwell"}
	rcvs := map[string]*bodyReceiver{}
	s := newSource(t, "gov", "id INT PRIMARY KEY, email VARCHAR(64), name VARCHAR(64), v INT, secret VARCHAR(64)", func(cfg *config.Config) {
		sink := func(name, url, format string) config.Sink {
			return config.Sink{Name: name, URL: url, Format: format,
				Filter:      `op == "d" || after.v >= 10`,
				HashColumns: []string{"email"}, HashKey: hashKey, MaskColumns: []string{"name"},
				IncludeColumns: []string{"id", "email", "name", "v"}}
		}
		for _, f := range formats {
			rcvs[f] = newBodyReceiver(t)
			cfg.Sinks = append(cfg.Sinks, sink("hook-"+f, rcvs[f].srv.URL, f))
		}
		cfg.Sinks = append(cfg.Sinks, sink("kafka", "kafka://"+kc.ListenAddrs()[0]+"/gov", "maxwell"))
	})
	runEngine(t, s.cfg, nil)
	for _, q := range []string{
		"INSERT INTO {t} VALUES (1, 'a@x', 'Ann', 5, 's1')", // filtered: v < 10
		"INSERT INTO {t} VALUES (2, 'b@x', 'Bob', 15, 's2')",
		"UPDATE {t} SET v = 20 WHERE id = 1",
		"DELETE FROM {t} WHERE id = 2",
	} {
		if _, err := s.db.Exec(strings.ReplaceAll(q, "{t}", "`"+s.src+"`.t")); err != nil {
			t.Fatal(err)
		}
	}
	h := func(v string) string {
		b, err := canonical.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		m := hmac.New(sha256.New, []byte(hashKey))
		m.Write(b)
		return hex.EncodeToString(m.Sum(nil))
	}
	row := func(id float64, email string, v float64) map[string]any {
		return map[string]any{"id": id, "email": h(email), "name": "****", "v": v}
	}
	want := map[string]delivered{
		"c/2": {op: "c", id: 2, after: row(2, "b@x", 15)},
		"u/1": {op: "u", id: 1, before: row(1, "a@x", 5), after: row(1, "a@x", 20)},
		"d/2": {op: "d", id: 2, before: row(2, "b@x", 15)},
	}
	check := func(sink, f string, bodies [][]byte) {
		t.Helper()
		if len(bodies) != len(want) {
			t.Errorf("%s got %d messages, want %d", sink, len(bodies), len(want))
		}
		for _, b := range bodies {
			d := decodeDelivered(t, f, b)
			key := fmt.Sprintf("%s/%v", d.op, d.id)
			w, ok := want[key]
			if !ok {
				t.Errorf("%s: unexpected message %s", sink, b)
				continue
			}
			if f == "maxwell" {
				// Maxwell carries the new row, and of the old one only
				// the changed columns.
				if w.op == "u" {
					w.before, w.old = nil, map[string]any{"v": float64(5)}
				}
			}
			if !reflect.DeepEqual(d, w) {
				t.Errorf("%s %s:\n got  %+v\n want %+v\n body %s", sink, key, d, w, b)
			}
		}
	}
	for _, f := range formats {
		r := rcvs[f]
		waitFor(t, "hook-"+f+" gets its 3 changes", 30*time.Second, func() bool { return len(r.all()) >= len(want) })
	}
	var kafkaBodies [][]byte
	for _, r := range sinktest.ConsumeKafka(t, kc, 30*time.Second, len(want), "gov") {
		kafkaBodies = append(kafkaBodies, r.Value)
	}
	// Whatever else was on its way arrives meanwhile; then compare.
	waitFor(t, "the filtered records are counted", 10*time.Second, func() bool {
		n := 0
		for _, r := range records(t, s.db, s.stateDB, "gov:%") {
			if r.Status == "delivered" {
				n++
			}
		}
		return n == len(want)*(len(formats)+1)
	})
	for _, f := range formats {
		check("hook-"+f, f, rcvs[f].all())
	}
	check("kafka", "maxwell", kafkaBodies)
}
