package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
)

// Column transforms of a sink (drop_columns, include_columns,
// hash_columns, mask_columns) are applied at enqueue, to the change the
// sink's records are made of, so every format (debezium, cloudevents,
// maxwell) and every transport carries the same values: the formats only
// wrap the stored envelope.
//
// Key columns: drop and include never remove one from the key (per-key
// order and consumers' upserts rely on it). hash and mask do apply to the
// key, so the record's key, its Kafka partition and its ordering lane are
// those of the transformed value. A hashed key stays one key per row
// (HMAC is deterministic and collision-free in practice): order per row
// holds. A masked key is the same for every row, so all the table's
// changes share one key: they are delivered one at a time, in commit
// order, and a consumer that upserts by key sees one row.

// maskedValue replaces a masked column's value (null stays null: it
// tells nothing).
const maskedValue = "****"

// columnSet is a column list in drop_columns form: "col" in every table,
// "db.table.col" in one.
type columnSet struct {
	all   map[string]bool
	table map[string]map[string]bool
}

func newColumnSet(cols []string) columnSet {
	var c columnSet
	for _, col := range cols {
		db, rest, ok := strings.Cut(col, ".")
		if !ok {
			if c.all == nil {
				c.all = map[string]bool{}
			}
			c.all[col] = true
			continue
		}
		tbl, name, _ := strings.Cut(rest, ".")
		if c.table == nil {
			c.table = map[string]map[string]bool{}
		}
		t := db + "." + tbl
		if c.table[t] == nil {
			c.table[t] = map[string]bool{}
		}
		c.table[t][name] = true
	}
	return c
}

// in is the set's columns of table t ("db.tbl"); nil when none apply.
func (c columnSet) in(t string) *tableColumns {
	tc := tableColumns{all: c.all, table: c.table[t]}
	if len(tc.all) == 0 && len(tc.table) == 0 {
		return nil
	}
	return &tc
}

type tableColumns struct{ all, table map[string]bool }

// has reports whether col is in the set; false on a nil set.
func (t *tableColumns) has(col string) bool { return t != nil && (t.all[col] || t.table[col]) }

// transforms are a sink's column transforms.
type transforms struct {
	drop, include, hash, mask columnSet
	hashKey                   []byte
}

func newTransforms(s config.Sink) transforms {
	return transforms{
		drop: newColumnSet(s.DropColumns), include: newColumnSet(s.IncludeColumns),
		hash: newColumnSet(s.HashColumns), mask: newColumnSet(s.MaskColumns),
		hashKey: []byte(s.HashKeyValue().Value()),
	}
}

// mask returns ch with the route's column transforms applied to its row
// images and, for hash and mask, its key. The original change is never
// modified (other routes share it).
func (r *route) mask(ch *canonical.Change) *canonical.Change {
	t := ch.Source.DB + "." + ch.Source.Table
	drop, include, hash, mask := r.tf.drop.in(t), r.tf.include.in(t), r.tf.hash.in(t), r.tf.mask.in(t)
	if drop == nil && include == nil && hash == nil && mask == nil {
		return ch
	}
	value := func(col string, v any) any {
		switch {
		case v == nil:
			return nil
		case hash.has(col):
			return r.hmac(v)
		case mask.has(col):
			return maskedValue
		}
		return v
	}
	image := func(row canonical.Row) canonical.Row {
		if row == nil {
			return nil
		}
		out := make(canonical.Row, len(row))
		for k, v := range row {
			if drop.has(k) || (include != nil && !include.has(k)) {
				continue
			}
			out[k] = value(k, v)
		}
		return out
	}
	c := *ch
	// The key is read before the images lose columns, so it stays whole.
	key := ch.KeyRow()
	if key != nil && (hash != nil || mask != nil) {
		k := make(canonical.Row, len(key))
		for col, v := range key {
			k[col] = value(col, v)
		}
		key = k
	}
	c.Key, c.KeyCols = key, nil
	c.Before = image(ch.Before)
	c.After = image(ch.After)
	return &c
}

// hmac is the hex HMAC-SHA256 of v's canonical JSON under the sink's key:
// equal values hash equal in every table and every sink sharing the key,
// so joins on a hashed column still work.
func (r *route) hmac(v any) any {
	b, err := canonical.Marshal(v)
	if err != nil {
		return maskedValue // not a canonical value: never pass it through
	}
	m := hmac.New(sha256.New, r.tf.hashKey)
	m.Write(b)
	return hex.EncodeToString(m.Sum(nil))
}
