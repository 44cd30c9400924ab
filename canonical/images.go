package canonical

import "fmt"

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

// EncodeImages encodes c's After and Before. They share one buffer.
func EncodeImages(c *Change) (*Images, error) {
	e := getEncoder()
	defer putEncoder(e)
	buf := make([]byte, 0, 16+c.ImageBytes()*4/3)
	buf, err := e.object(buf, c.After, 0)
	if err != nil {
		return nil, fmt.Errorf("encode after: %w", err)
	}
	n := len(buf)
	if buf, err = e.object(buf, c.Before, 0); err != nil {
		return nil, fmt.Errorf("encode before: %w", err)
	}
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
