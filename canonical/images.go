package canonical

import (
	"bytes"
	"fmt"
)

// Images are a change's row images as canonical JSON, encoded once for
// both of their uses: the change's digest (DigestImages, computed when the
// change is keyed) and its envelope (AppendEnvelopeImages, when it is
// written). Both embed the images' canonical JSON byte for byte, so the
// results are those of DigestChange and MarshalEnvelope; encoding every
// image twice was about a tenth of cdcout's CPU per change
// (BenchmarkKafkaEndToEnd's profile).
type Images struct {
	After, Before []byte
}

// EncodeImages encodes c's After and Before. They share one buffer, of
// their exact size: they are encoded in the pooled encoder's buffer and
// copied, which cost less than sizing one for them up front (ImageBytes,
// a walk of both images' maps, a sixth of EncodeImages on realistic rows)
// and leaves no slack to carry until the batch is written.
func EncodeImages(c *Change) (*Images, error) {
	e := getEncoder()
	defer putEncoder(e)
	work, err := e.object(e.images[:0], c.After, 0)
	e.images = work
	if err != nil {
		return nil, fmt.Errorf("encode after: %w", err)
	}
	n := len(work)
	work, err = e.object(work, c.Before, 0)
	e.images = work
	if err != nil {
		return nil, fmt.Errorf("encode before: %w", err)
	}
	buf := bytes.Clone(work)
	return &Images{After: buf[:n:n], Before: buf[n:]}, nil
}

// Bytes is the size of the encoded images.
func (im *Images) Bytes() int { return len(im.After) + len(im.Before) }

// DigestImages is DigestChange(pipe, c) with c's images from im
// (EncodeImages of c).
func DigestImages(pipe string, c *Change, im *Images) string { return digest(pipe, c, im) }

// AppendEnvelopeImages is AppendEnvelope(dst, c, id) with c's images from
// im (EncodeImages of c, before any change to c's images).
func AppendEnvelopeImages(dst []byte, c *Change, id string, im *Images) ([]byte, error) {
	return appendEnvelope(dst, c, id, im)
}
