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
