package outbox

import "hash/fnv"

// ClaimerID is the outbox's claimer column for a drainer's ClaimedBy
// ("<replica-id>/<nonce>"): FNV-1a 64 of it, never 0 (0 is "not claimed").
// A number rather than the string keeps the column fixed-width, so a claim
// updates the row in place (state/migrations.go); two live drainers whose
// ids collide in 64 bits are not a practical concern.
func ClaimerID(claimedBy string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(claimedBy))
	id := int64(h.Sum64() & (1<<63 - 1))
	if id == 0 {
		id = 1
	}
	return id
}
