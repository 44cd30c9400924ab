package format

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// docsExample is a JSON example in docs/formats.md: a ```json block right
// after a line naming the golden file it shows.
var docsExample = regexp.MustCompile("(?m)^<!-- golden: (\\S+) -->\n```json\n([^`]*)```\n")

// TestDocsExamplesAreGoldens: every JSON example in docs/formats.md is a
// golden file of testdata, pretty-printed, so the documented shapes are
// the ones the tests hold the formats to. -update rewrites the examples
// from the goldens.
func TestDocsExamplesAreGoldens(t *testing.T) {
	path := filepath.Join("..", "docs", "formats.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks := bytes.Count(doc, []byte("```json\n"))
	matches := docsExample.FindAllSubmatchIndex(doc, -1)
	if len(matches) != blocks {
		t.Fatalf("%s has %d JSON examples, %d of them after a <!-- golden: <file> --> line: name the golden of each", path, blocks, len(matches))
	}
	var out []byte
	last := 0
	for _, m := range matches {
		name, shown := string(doc[m[2]:m[3]]), doc[m[4]:m[5]]
		golden, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatalf("%s: example of %s: %v", path, name, err)
		}
		var want bytes.Buffer
		if err := json.Indent(&want, bytes.TrimSpace(golden), "", "  "); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want.WriteByte('\n')
		out = append(append(out, doc[last:m[4]]...), want.Bytes()...)
		last = m[5]
		if !*update && !bytes.Equal(shown, want.Bytes()) {
			t.Errorf("%s: the example of %s is not the golden file (go test ./format -update rewrites it):\n%s", path, name, want.Bytes())
		}
	}
	if *update {
		if err := os.WriteFile(path, append(out, doc[last:]...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
