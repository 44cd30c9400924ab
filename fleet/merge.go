package fleet

import (
	"encoding/json"
	"sort"
	"time"
)

// Member is a replica the membership knows about.
type Member struct {
	ID string `json:"id"`
	// StartedAt of the member's current generation, or zero when unknown
	// (membership from a lease). A row written by an older generation
	// does not count as this member's answer.
	StartedAt time.Time `json:"startedAt,omitzero"`
}

// Replica is one replica's readable row in a merged view.
type Replica[T any] struct {
	ReplicaID   string    `json:"replicaId"`
	Version     string    `json:"version,omitempty"`
	StartedAt   time.Time `json:"startedAt"`
	AgeSeconds  float64   `json:"ageSeconds"`
	Stale       bool      `json:"stale"`
	ReachableAt string    `json:"reachableAt,omitempty"`
	Payload     T         `json:"payload"`
}

// StaleRow is a row too old to treat as current, with its age.
type StaleRow struct {
	ReplicaID  string  `json:"replicaId"`
	AgeSeconds float64 `json:"ageSeconds"`
}

// Result is a merged fleet view.
type Result[T any] struct {
	// Replicas has one entry per replica with a readable row, stale or not.
	Replicas []Replica[T] `json:"replicas"`
	// Missing lists members that have written nothing readable: no row, an
	// undecodable one, or only a previous generation's.
	Missing []string `json:"missing"`
	// Responded counts members with a readable, current-generation row
	// that is not stale; Expected is the number of members.
	Responded int `json:"responded"`
	Expected  int `json:"expected"`
	// Stale lists rows older than staleAfter, with their ages, instead of
	// dropping them: dropping would make a partial answer look complete.
	Stale []StaleRow `json:"stale"`
	// Versions counts the versions among readable rows, and is nil unless
	// they differ: a note that is always there is one everybody learns to
	// skip, and a rolling deploy is exactly when it matters.
	Versions map[string]int `json:"versions,omitempty"`
}

// Merge merges rows (one kind) against members. Payloads are decoded into
// T; a row whose payload does not decode counts as not written. Rows are
// never filtered out for age: a stale row is listed and marked.
func Merge[T any](rows []Row, members []Member, staleAfter time.Duration) Result[T] {
	if staleAfter <= 0 {
		staleAfter = DefaultStaleAfter
	}
	res := Result[T]{Missing: []string{}, Stale: []StaleRow{}, Replicas: []Replica[T]{}}
	// Newest readable generation per replica (rows of one kind hold one per
	// replica, but a caller may pass several reads concatenated).
	readable := map[string]Row{}
	for _, r := range rows {
		if len(r.Payload) > 0 && string(r.Payload) != "null" {
			var p T
			if err := json.Unmarshal(r.Payload, &p); err != nil {
				continue
			}
		}
		if prev, ok := readable[r.ReplicaID]; ok && !r.StartedAt.After(prev.StartedAt) {
			continue
		}
		readable[r.ReplicaID] = r
	}
	versions := map[string]int{}
	for _, r := range readable {
		var p T
		if len(r.Payload) > 0 {
			_ = json.Unmarshal(r.Payload, &p) // decoded once above
		}
		stale := r.Age > staleAfter
		res.Replicas = append(res.Replicas, Replica[T]{
			ReplicaID: r.ReplicaID, Version: r.Version, StartedAt: r.StartedAt,
			AgeSeconds: r.Age.Seconds(), Stale: stale, ReachableAt: r.ReachableAt, Payload: p,
		})
		if stale {
			res.Stale = append(res.Stale, StaleRow{ReplicaID: r.ReplicaID, AgeSeconds: r.Age.Seconds()})
		}
		versions[r.Version]++
	}
	sort.Slice(res.Replicas, func(i, j int) bool { return res.Replicas[i].ReplicaID < res.Replicas[j].ReplicaID })
	sort.Slice(res.Stale, func(i, j int) bool { return res.Stale[i].ReplicaID < res.Stale[j].ReplicaID })

	seen := map[string]bool{}
	for _, m := range members {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		res.Expected++
		r, ok := readable[m.ID]
		if !ok || (!m.StartedAt.IsZero() && r.StartedAt.Before(m.StartedAt)) {
			res.Missing = append(res.Missing, m.ID)
			continue
		}
		if r.Age <= staleAfter {
			res.Responded++
		}
	}
	sort.Strings(res.Missing)
	if len(versions) > 1 {
		res.Versions = versions
	}
	return res
}
