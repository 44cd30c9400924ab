package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/outbox"
)

const testHashKey = "k3y-for-hmac-0123456789"

func mustRoute(t *testing.T, s config.Sink) *route {
	t.Helper()
	r, err := newRoute(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func customerChange(id int64, email string) *canonical.Change {
	return &canonical.Change{Op: canonical.OpUpdate, KeyCols: []string{"id"},
		Before: canonical.Row{"id": id, "email": "old-" + email, "phone": "555-0100", "name": "Al", "ssn": "078-05-1120", "note": nil},
		After:  canonical.Row{"id": id, "email": email, "phone": "555-0199", "name": "Al", "ssn": "078-05-1120", "note": nil},
		Source: canonical.Source{Instance: "prod", DB: "shop", Table: "customers", TsMs: 1764590401000}}
}

// TestTransformsInEveryFormat: hash, mask, include and drop give the same
// values in the debezium, cloudevents and maxwell bodies, and none of the
// original values of the transformed columns appears in any.
func TestTransformsInEveryFormat(t *testing.T) {
	r := mustRoute(t, config.Sink{Name: "s", HashColumns: []string{"email"}, MaskColumns: []string{"shop.customers.phone"},
		IncludeColumns: []string{"id", "email", "phone", "name", "note"}, DropColumns: []string{"name"}, HashKey: testHashKey})
	ch := customerChange(7, "al@example.com")
	got := r.mask(ch)
	if ch.After["email"] != "al@example.com" || ch.Key != nil {
		t.Fatalf("the shared change was modified: %+v", ch)
	}
	hash := r.hmac("al@example.com").(string)
	want := canonical.Row{"id": int64(7), "email": hash, "phone": maskedValue, "note": nil}
	if len(got.After) != len(want) || got.After["email"] != hash || got.After["phone"] != maskedValue || got.After["id"] != int64(7) {
		t.Fatalf("after = %v, want %v", got.After, want)
	}
	if got.Before["email"] != r.hmac("old-al@example.com") || got.Before["phone"] != maskedValue || len(got.Before) != 4 {
		t.Fatalf("before = %v", got.Before)
	}
	if got.Key["id"] != int64(7) {
		t.Fatalf("key = %v, want the id untouched", got.Key)
	}
	payload, err := canonical.MarshalEnvelope(got, "0190a000-0000-7000-8000-000000000007")
	if err != nil {
		t.Fatal(err)
	}
	rec := outbox.Record{ID: "0190a000-0000-7000-8000-000000000007", Pipe: "prod:shop.customers:s", Sink: "s", DB: "shop", Table: "customers",
		Op: got.Op, Key: canonical.KeyJSONOf(got), Payload: payload, Attempt: 1, CommitTime: time.UnixMilli(ch.Source.TsMs)}
	for _, name := range format.Names {
		f, err := format.New(name)
		if err != nil {
			t.Fatal(err)
		}
		body, err := f.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		b := string(body)
		for _, in := range []string{`"email":"` + hash + `"`, `"phone":"****"`, `"id":7`} {
			if !strings.Contains(b, in) {
				t.Errorf("%s: no %s in %s", name, in, b)
			}
		}
		for _, out := range []string{"al@example.com", "555-01", `"name"`, `"ssn"`, "078-05"} {
			if strings.Contains(b, out) {
				t.Errorf("%s: %s in %s", name, out, b)
			}
		}
	}
}

// TestHashedKey: hashing a key column hashes the key too, one hash per
// row (order per row holds) and the same hash as the column elsewhere
// (joins work); masking a key column gives every row one key.
func TestHashedKey(t *testing.T) {
	hashed := mustRoute(t, config.Sink{Name: "h", HashColumns: []string{"id", "shop.orders.customer_id"}, HashKey: testHashKey})
	a, b := hashed.mask(customerChange(7, "a@x")), hashed.mask(customerChange(8, "b@x"))
	if a.Key["id"] == int64(7) || a.Key["id"] != a.After["id"] || a.Key["id"] == b.Key["id"] {
		t.Fatalf("hashed keys: %v and %v", a.Key, b.Key)
	}
	order := hashed.mask(&canonical.Change{Op: canonical.OpCreate, Key: canonical.Row{"id": int64(1)},
		After: canonical.Row{"id": int64(1), "customer_id": int64(7)}, Source: canonical.Source{DB: "shop", Table: "orders"}})
	if order.After["customer_id"] != a.After["id"] {
		t.Errorf("orders.customer_id 7 hashes to %v, customers.id 7 to %v: a join would break", order.After["customer_id"], a.After["id"])
	}
	other := mustRoute(t, config.Sink{Name: "o", HashColumns: []string{"id"}, HashKey: testHashKey + "-other"})
	if other.mask(customerChange(7, "a@x")).Key["id"] == a.Key["id"] {
		t.Errorf("another key gives the same hash")
	}
	masked := mustRoute(t, config.Sink{Name: "m", MaskColumns: []string{"id"}})
	if k1, k2 := canonical.KeyJSONOf(masked.mask(customerChange(7, "a@x"))), canonical.KeyJSONOf(masked.mask(customerChange(8, "b@x"))); k1 != k2 || k1 != `{"id":"****"}` {
		t.Errorf("masked keys %s and %s, want one key {\"id\":\"****\"}", k1, k2)
	}
	untouched := mustRoute(t, config.Sink{Name: "u"})
	if ch := customerChange(7, "a@x"); untouched.mask(ch) != ch {
		t.Errorf("a sink without transforms copies the change")
	}
}
