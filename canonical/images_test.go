package canonical

import (
	"bytes"
	"testing"
)

// Digest and envelope made from the images encoded once are byte for byte
// those made from the change; bad images are errors, as in the envelope.
func TestImagesMatchChange(t *testing.T) {
	insert := sampleChange()
	insert.Op, insert.Before = OpCreate, nil
	del := sampleChange()
	del.Op, del.After = OpDelete, nil
	noKey := sampleChange()
	noKey.Key = nil
	for name, c := range map[string]*Change{"update": sampleChange(), "insert": insert, "delete": del, "no key": noKey} {
		im, err := EncodeImages(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := DigestImages("i:shop.items:hook", c, im), DigestChange("i:shop.items:hook", c); got != want || len(got) != 64 {
			t.Errorf("%s: digest from images %s, want %s", name, got, want)
		}
		got, err := AppendEnvelopeImages(nil, c, "0190f1a2-7b3c-7d4e-8f90-a1b2c3d4e5f6", im)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := MarshalEnvelope(c, "0190f1a2-7b3c-7d4e-8f90-a1b2c3d4e5f6")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: envelope from images\n%s\nwant\n%s", name, got, want)
		}
	}
	if _, err := EncodeImages(&Change{Op: OpCreate, After: Row{"a": struct{}{}}}); err == nil {
		t.Fatal("images of an invalid row: no error")
	}
}
