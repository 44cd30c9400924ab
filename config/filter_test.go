package config

import (
	"strings"
	"testing"
)

// TestSinkFilterChecked: a filter is type-checked at start-up and its
// error carries the field path and the position.
func TestSinkFilterChecked(t *testing.T) {
	file := writeFile(t, "dsn: "+goodDSN+"\nsinks:\n  - url: 'stdout:'\n    filter: 'after.v >= 10'\n  - name: b\n    url: 'stdout:'\n    filter: 'op == 1'\n")
	_, err := Load(Sources{Flags: []Setting{{"config", file}}})
	if err == nil || !strings.Contains(err.Error(), "sinks[1].filter: ERROR: <input>:1:4: found no matching overload for '_==_' applied to '(string, int)'") {
		t.Fatalf("Load = %v, want sinks[1].filter's type error", err)
	}
	if strings.Contains(err.Error(), "sinks[0]") {
		t.Errorf("the good filter is reported too: %v", err)
	}
}

// TestSinkTransformsChecked: column lists are checked like drop_columns,
// hash_columns need a key of 16 bytes or more, from the file or the
// config, and no error quotes the key.
func TestSinkTransformsChecked(t *testing.T) {
	keyFile := writeFile(t, "file-key-0123456789abcdef\n")
	for _, tc := range []struct{ sink, want string }{
		{"hash_columns: [email]\n    hash_key: 'short-KEY'", "sinks[0].hash_key: the key is 9 bytes long; use at least 16"},
		{"hash_columns: [email]", "sinks[0].hash_columns: need hash_key or hash_key_file"},
		{"mask_columns: ['a.b']", `sinks[0].mask_columns[0]: "a.b": want "column" or "db.table.column"`},
		{"include_columns: ['x.y.z.w']", `sinks[0].include_columns[0]: "x.y.z.w"`},
		{"hash_key: 'unused-key-0123456789KEY'", "sinks[0].hash_key: set, but no hash_columns use it"},
		{"hash_columns: [email]\n    hash_key_file: /nonexistent/key", "sinks[0].hash_key_file: /nonexistent/key does not exist"},
		{"hash_columns: [email]\n    hash_key: 'k-0123456789abcdefKEY'\n    hash_key_file: " + keyFile, "sinks[0].hash_key_file: set hash_key or hash_key_file, not both"},
		{"hash_columns: [email]\n    hash_key_file: " + keyFile, ""},
	} {
		file := writeFile(t, "dsn: "+goodDSN+"\nsinks:\n  - url: 'stdout:'\n    "+tc.sink+"\n")
		cfg, err := Load(Sources{Flags: []Setting{{"config", file}}})
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.sink, err)
			} else if got := cfg.Sinks[0].HashKeyValue().Value(); got != "file-key-0123456789abcdef" {
				t.Errorf("%s: key %q, want the file's without its newline", tc.sink, got)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Load = %v, want %q", tc.sink, err, tc.want)
		} else if strings.Contains(err.Error(), "KEY") {
			t.Errorf("%s: the error quotes the key: %v", tc.sink, err)
		}
	}
}

// TestSinkKeyChecked: key: needs a sink with a message key and columns
// the delivered row keeps. The columns' existence is the engine's check
// against the source schema.
func TestSinkKeyChecked(t *testing.T) {
	for _, tc := range []struct{ url, sink, want string }{
		{"'stdout:'", "key: [customer]", "sinks[0].key: only kafka, nats, redis and pubsub sinks have a message key"},
		{"kafka://k:9092/t", "key: [a, a]", `sinks[0].key[1]: "a" is listed twice`},
		{"kafka://k:9092/t", "key: [a.b]", `sinks[0].key[0]: "a.b": want a column name`},
		{"kafka://k:9092/t", "key: [email]\n    drop_columns: [email]", `sinks[0].key[0]: "email" is in drop_columns`},
		{"kafka://k:9092/t", "key: [email]\n    include_columns: [id]", `sinks[0].key[0]: "email" is not in include_columns`},
		{"nats://n:4222/s.{key}", "key: [customer, region]", ""},
	} {
		file := writeFile(t, "dsn: "+goodDSN+"\nsinks:\n  - url: "+tc.url+"\n    "+tc.sink+"\n")
		_, err := Load(Sources{Flags: []Setting{{"config", file}}})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.sink, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Load = %v, want %q", tc.sink, err, tc.want)
		}
	}
}

// TestHashKeyFromEnvironment: hash_key may name an environment variable
// (the third source besides the file and hash_key_file).
func TestHashKeyFromEnvironment(t *testing.T) {
	t.Setenv("CDCOUT_TEST_HASH_KEY", "env-key-0123456789abcdef")
	file := writeFile(t, "dsn: "+goodDSN+"\nsinks:\n  - url: 'stdout:'\n    hash_columns: [email]\n    hash_key: ${CDCOUT_TEST_HASH_KEY}\n")
	cfg, err := Load(Sources{Flags: []Setting{{"config", file}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Sinks[0].HashKeyValue().Value(); got != "env-key-0123456789abcdef" {
		t.Fatalf("hash key %q, want the variable's", got)
	}
}
