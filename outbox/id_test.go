package outbox

import (
	"sync"
	"testing"

	"github.com/google/uuid"
)

func TestNewIDIncreasing(t *testing.T) {
	prev := NewID()
	for i := 0; i < 100_000; i++ {
		id := NewID()
		if id <= prev {
			t.Fatalf("id %d: %s not after %s", i, id, prev)
		}
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("id %s: version %v variant %v err %v", id, u.Version(), u.Variant(), err)
		}
		prev = id
	}
}

func TestNewIDConcurrentUnique(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]string, 0, 5000)
			for i := 0; i < 5000; i++ {
				local = append(local, NewID())
			}
			for i := 1; i < len(local); i++ {
				if local[i] <= local[i-1] {
					t.Errorf("not increasing within a goroutine: %s then %s", local[i-1], local[i])
					return
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range local {
				if seen[id] {
					t.Errorf("duplicate id %s", id)
				}
				seen[id] = true
			}
		}()
	}
	wg.Wait()
}

// An id from a clock far ahead (a previous leader's) is a floor: later ids
// sort after it even though this clock is behind.
func TestRaiseIDFloor(t *testing.T) {
	future := "ffffffff-fff0-7fff-bfff-ffffffffffff"
	defer resetIDs()
	if err := raiseIDFloor(future); err != nil {
		t.Fatal(err)
	}
	a, b := NewID(), NewID()
	if a <= future || b <= a {
		t.Fatalf("ids after floor %s: %s, %s", future, a, b)
	}
	if u := uuid.MustParse(b); u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("successor id %s is not a v7 uuid", b)
	}
	if err := raiseIDFloor("not-a-uuid"); err == nil {
		t.Fatal("RaiseIDFloor accepted garbage")
	}
}

// resetIDs undoes a test's floor for the tests after it: a floor can only
// rise, so they would otherwise get ids from far in the future.
func resetIDs() {
	ids.mu.Lock()
	ids.last = uuid.UUID{}
	ids.mu.Unlock()
}

// TestDerivedID: the same key and time give the same id, another key
// another; the id is a version 8 UUID that sorts by its commit time.
func TestDerivedID(t *testing.T) {
	a, b := DerivedID(1_700_000_000_000, "hook\x00k1"), DerivedID(1_700_000_000_000, "hook\x00k1")
	c := DerivedID(1_700_000_000_000, "hook\x00k2")
	later := DerivedID(1_700_000_000_001, "hook\x00k0")
	if a != b || a == c {
		t.Fatalf("ids %s %s %s: want the first two equal, the third not", a, b, c)
	}
	u, err := uuid.Parse(a)
	if err != nil || u.Version() != 8 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("id %s: %v, version %d, variant %v", a, err, u.Version(), u.Variant())
	}
	if !(a < later && c < later) {
		t.Errorf("%s and %s do not sort before %s, a millisecond later", a, c, later)
	}
}

// TestPrepareBatchDrawsAtomically: no id drawn elsewhere while a batch
// is prepared (the batch before, retried by the writer goroutine) sorts
// between the batch's ids. One that did, with the draw count read after
// them, would let the prepared ids stand while an id later than some of
// them committed first: a key's older change delivered after its newer one
// (seen once in e2e TestCrashRecovery).
func TestPrepareBatchDrawsAtomically(t *testing.T) {
	s := NewStore(nil, "cdcout", nil)
	var items []Pending
	for i := 0; i < 1000; i++ {
		items = append(items, gtidItem("a:app.users:hook", 1, i))
	}
	for round := 0; round < 20; round++ {
		stop := make(chan struct{})
		drawn := make(chan []string)
		go func() {
			var out []string
			for {
				select {
				case <-stop:
					drawn <- out
					return
				default:
					out = append(out, NewID())
				}
			}
		}()
		b, err := s.PrepareBatch(items, nil)
		close(stop)
		others := <-drawn
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := b.its[0].id, b.its[len(b.its)-1].id
		for _, id := range others {
			if id > lo && id < hi {
				t.Fatalf("round %d: id %s drawn elsewhere sorts inside the batch's %s…%s", round, id, lo, hi)
			}
		}
	}
}
