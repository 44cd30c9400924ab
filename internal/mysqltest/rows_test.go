package mysqltest

import (
	"fmt"
	"strings"
	"testing"
)

// recordingTB keeps what SameRows reports instead of failing the test.
type recordingTB struct {
	testing.TB
	errs  []string
	fatal string
}

func (r *recordingTB) Helper()                      {}
func (r *recordingTB) Errorf(f string, args ...any) { r.errs = append(r.errs, fmt.Sprintf(f, args...)) }
func (r *recordingTB) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }

func TestSameRows(t *testing.T) {
	var ok recordingTB
	SameRows(&ok, "consumer", map[int64]string{1: "1/a", 2: "2/b"}, map[int64]string{1: "1/a", 2: "2/b"})
	if len(ok.errs) != 0 || ok.fatal != "" {
		t.Fatalf("equal rows reported %q, %q", ok.errs, ok.fatal)
	}

	var r recordingTB
	SameRows(&r, "consumer", map[int64]string{1: "1/a", 2: "2/x", 4: "4/d"}, map[int64]string{1: "1/a", 2: "2/b", 3: "3/c"})
	joined := strings.Join(r.errs, "\n")
	for _, want := range []string{
		`key 2: consumer has "2/x" (present true), table has "2/b"`,
		`key 3: consumer has "" (present false), table has "3/c"`,
		`key 4: consumer has "4/d", deleted from the table`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("reports %q, want a line %q", joined, want)
		}
	}
	if got, want := r.fatal, "3 keys differ between the consumer and the table"; got != want {
		t.Errorf("fatal %q, want %q", got, want)
	}

	var many recordingTB
	got := map[int64]int{}
	for id := range int64(25) {
		got[id] = 1
	}
	SameRows(&many, "receiver", got, map[int64]int{})
	if len(many.errs) != 10 || many.fatal != "25 keys differ between the receiver and the table" {
		t.Errorf("25 extra rows: %d reports, fatal %q; want 10 and the count", len(many.errs), many.fatal)
	}
}
