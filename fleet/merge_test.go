package fleet

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

type payload struct {
	Pipes int `json:"pipes"`
}

func row(id, version string, age time.Duration) Row {
	return Row{ReplicaID: id, Kind: KindEngine, Version: version, Age: age,
		StartedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Payload: json.RawMessage(`{"pipes":2}`)}
}

func members(ids ...string) []Member {
	var out []Member
	for _, id := range ids {
		out = append(out, Member{ID: id})
	}
	return out
}

func TestMergeMissing(t *testing.T) {
	res := Merge[payload]([]Row{row("a", "v1", time.Second)}, members("a", "b"), 0)
	if got, want := res.Missing, []string{"b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("missing = %v, want %v", got, want)
	}
	if res.Responded != 1 || res.Expected != 2 {
		t.Fatalf("responded/expected = %d/%d, want 1/2", res.Responded, res.Expected)
	}
	if got, want := len(res.Replicas), 1; got != want {
		t.Fatalf("replicas = %d, want %d", got, want)
	}
	if got, want := res.Replicas[0].Payload.Pipes, 2; got != want {
		t.Fatalf("payload pipes = %d, want %d", got, want)
	}
}

func TestMergeStaleKeptWithAge(t *testing.T) {
	rows := []Row{row("a", "v1", 5*time.Second), row("b", "v1", 3*time.Minute)}
	res := Merge[payload](rows, members("a", "b"), 2*time.Minute)
	if got, want := res.Stale, []StaleRow{{ReplicaID: "b", AgeSeconds: 180}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("stale = %v, want %v", got, want)
	}
	// The stale row is listed, marked, and not counted as an answer.
	if got, want := len(res.Replicas), 2; got != want {
		t.Fatalf("replicas = %d, want %d (stale rows must not be dropped)", got, want)
	}
	if !res.Replicas[1].Stale || res.Replicas[0].Stale {
		t.Fatalf("stale marks = %v/%v, want false/true", res.Replicas[0].Stale, res.Replicas[1].Stale)
	}
	if res.Responded != 1 || res.Expected != 2 || len(res.Missing) != 0 {
		t.Fatalf("responded/expected/missing = %d/%d/%v, want 1/2/[]", res.Responded, res.Expected, res.Missing)
	}
}

func TestMergeDefaultStaleAfter(t *testing.T) {
	res := Merge[payload]([]Row{row("a", "v1", 119*time.Second), row("b", "v1", 121*time.Second)}, nil, 0)
	if len(res.Stale) != 1 || res.Stale[0].ReplicaID != "b" {
		t.Fatalf("stale = %v, want only b (default %v)", res.Stale, DefaultStaleAfter)
	}
}

func TestMergeVersions(t *testing.T) {
	t.Run("mixed", func(t *testing.T) {
		rows := []Row{row("a", "v1", 0), row("b", "v2", 0), row("c", "v2", 0)}
		res := Merge[payload](rows, members("a", "b", "c"), 0)
		if got, want := res.Versions, map[string]int{"v1": 1, "v2": 2}; !reflect.DeepEqual(got, want) {
			t.Fatalf("versions = %v, want %v", got, want)
		}
	})
	t.Run("single version is not reported", func(t *testing.T) {
		rows := []Row{row("a", "v1", 0), row("b", "v1", 0)}
		res := Merge[payload](rows, members("a", "b"), 0)
		if res.Versions != nil {
			t.Fatalf("versions = %v, want nil", res.Versions)
		}
		b, _ := json.Marshal(res)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		if _, ok := m["versions"]; ok {
			t.Fatalf("json has versions: %s", b)
		}
	})
}

func TestMergeUnreadableAndOldGeneration(t *testing.T) {
	bad := row("a", "v1", 0)
	bad.Payload = json.RawMessage(`{"pipes":"many"}`)
	old := row("b", "v1", 0)
	m := []Member{{ID: "a"}, {ID: "b", StartedAt: old.StartedAt.Add(time.Minute)}, {ID: "b"}}
	res := Merge[payload]([]Row{bad, old}, m, 0)
	if got, want := res.Missing, []string{"a", "b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("missing = %v, want %v", got, want)
	}
	if res.Expected != 2 || res.Responded != 0 {
		t.Fatalf("responded/expected = %d/%d, want 0/2", res.Responded, res.Expected)
	}
}

func TestMergeNewestGeneration(t *testing.T) {
	older := row("a", "v1", time.Minute)
	newer := row("a", "v2", time.Second)
	newer.StartedAt = older.StartedAt.Add(time.Hour)
	res := Merge[payload]([]Row{newer, older}, members("a"), 0)
	if len(res.Replicas) != 1 || res.Replicas[0].Version != "v2" || res.Versions != nil {
		t.Fatalf("replicas = %+v versions = %v, want only the v2 generation", res.Replicas, res.Versions)
	}
}
