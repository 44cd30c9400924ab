package config

import (
	"cmp"
	"fmt"
	"strings"
)

// HashKeyValue is the key hash_columns are HMACed with: hash_key, or the
// contents of hash_key_file read by Validate (trailing newline removed).
func (s *Sink) HashKeyValue() Secret { return cmp.Or(s.HashKey, s.hashFileKey) }

// checkColumns reports entries of a column list that are neither
// "column" nor "db.table.column".
func checkColumns(errs *Errors, path string, cols []string) {
	for i, col := range cols {
		parts := strings.Split(col, ".")
		if (len(parts) != 1 && len(parts) != 3) || slicesHasEmpty(parts) {
			errs.add(fmt.Sprintf("%s[%d]", path, i), "%q: want \"column\" or \"db.table.column\"", col)
		}
	}
}

// validateTransforms checks hash_columns, mask_columns and
// include_columns and reads hash_key_file. No message quotes the key.
func (s *Sink) validateTransforms(errs *Errors, at string) {
	checkColumns(errs, at+".hash_columns", s.HashColumns)
	checkColumns(errs, at+".mask_columns", s.MaskColumns)
	checkColumns(errs, at+".include_columns", s.IncludeColumns)
	s.hashFileKey = readSecretFile(errs, at+".", "hash_key", "hash_key_file", s.HashKey, s.HashKeyFile)
	key := s.HashKeyValue()
	switch {
	case len(s.HashColumns) > 0 && key == "" && s.HashKeyFile == "":
		errs.add(at+".hash_columns", "need hash_key or hash_key_file (the HMAC-SHA256 key; e.g. openssl rand -hex 32)")
	case len(s.HashColumns) > 0 && len(key.Value()) < minSecretLen && (s.HashKeyFile == "" || s.hashFileKey != ""):
		errs.add(at+".hash_key", "the key is %d bytes long; use at least %d", len(key.Value()), minSecretLen)
	case len(s.HashColumns) == 0 && (s.HashKey != "" || s.HashKeyFile != ""):
		errs.add(at+".hash_key", "set, but no hash_columns use it")
	}
}

// keySchemes are the sinks whose messages have a key: Kafka (record key),
// NATS ({key} in the subject), Redis (the "key" field) and Pub/Sub
// (ordering key). A webhook, file or stdout sink has none, so key: there
// would be silently ignored.
var keySchemes = map[string]bool{"kafka": true, "nats": true, "redis": true, "rediss": true, "pubsub": true}

// validateKey checks key:. Whether each column exists in the sink's
// tables is checked against the source's schema when the engine starts.
func (s *Sink) validateKey(errs *Errors, at, scheme string) {
	if len(s.Key) == 0 {
		return
	}
	if !keySchemes[scheme] {
		errs.add(at+".key", "only kafka, nats, redis and pubsub sinks have a message key")
	}
	seen := map[string]bool{}
	drop, include := plainColumns(s.DropColumns), plainColumns(s.IncludeColumns)
	for i, col := range s.Key {
		path := fmt.Sprintf("%s.key[%d]", at, i)
		switch {
		case col == "" || strings.Contains(col, "."):
			errs.add(path, "%q: want a column name", col)
		case seen[col]:
			errs.add(path, "%q is listed twice", col)
		case drop[col]:
			errs.add(path, "%q is in drop_columns: the delivered row does not have it", col)
		case len(include) > 0 && len(include) == len(s.IncludeColumns) && !include[col]:
			errs.add(path, "%q is not in include_columns: the delivered row does not have it", col)
		}
		seen[col] = true
	}
}

// plainColumns are the entries of a column list that apply to every table.
func plainColumns(cols []string) map[string]bool {
	out := map[string]bool{}
	for _, c := range cols {
		if !strings.Contains(c, ".") {
			out[c] = true
		}
	}
	return out
}
