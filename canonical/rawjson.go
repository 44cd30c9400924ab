package canonical

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// rawJSON re-emits a JSON document canonically, straight from its bytes:
// object members sorted bytewise by their decoded keys at every depth
// (duplicate keys keep the last value, as MySQL 8 does), strings escaped
// as appendString escapes them, numbers kept as written (converting them
// to float64 would corrupt big integers and high-precision decimals stored
// in JSON columns), no whitespace. The bytes are exactly what
// ParseJSON + Marshal produce (FuzzRawJSON holds the two to it), without
// building a map per object and a value per member: on documents of a few
// hundred bytes that was four fifths of an envelope's cost.
func (e *encoder) rawJSON(dst []byte, raw RawJSON, depth int) ([]byte, error) {
	if !utf8.Valid(raw) {
		// encoding/json would silently replace bad bytes with U+FFFD.
		return dst, errors.New("canonical json: JSON document is not valid UTF-8")
	}
	s := jsonScanner{b: raw, e: e}
	s.space()
	out, err := s.value(dst, depth, true)
	if err == nil {
		if s.space(); s.i < len(s.b) {
			err = errors.New("trailing data after the document")
		}
	}
	if err != nil {
		return dst, fmt.Errorf("canonical json: parse JSON document: %w", err)
	}
	return out, nil
}

// jsonScanner reads one document; i is the next byte. With emit false a
// value is only checked and skipped (ValidJSON).
type jsonScanner struct {
	b []byte
	i int
	e *encoder
}

// member is one object member written: its decoded key and where its
// `"key":value` starts and ends in the output.
type member struct {
	key     string
	at, end int
}

var errJSONEnd = errors.New("unexpected end of JSON input")

func (s *jsonScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) syntax(what string) error {
	if s.i >= len(s.b) {
		return errJSONEnd
	}
	return fmt.Errorf("invalid character %q %s at offset %d", s.b[s.i], what, s.i)
}

func (s *jsonScanner) value(dst []byte, depth int, emit bool) ([]byte, error) {
	if depth > maxDepth {
		return dst, errors.New("nesting too deep")
	}
	if s.i >= len(s.b) {
		return dst, errJSONEnd
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object(dst, depth, emit)
	case c == '[':
		return s.array(dst, depth, emit)
	case c == '"':
		str, plain, err := s.str()
		if err != nil || !emit {
			return dst, err
		}
		if plain {
			// No escapes, no control characters, valid UTF-8:
			// appendString would write these bytes.
			return append(append(append(dst, '"'), str...), '"'), nil
		}
		return appendString(dst, str)
	case c == 't' || c == 'f' || c == 'n':
		for _, lit := range [...]string{"true", "false", "null"} {
			if strings.HasPrefix(unsafe.String(unsafe.SliceData(s.b[s.i:]), len(s.b)-s.i), lit) {
				s.i += len(lit)
				if emit {
					dst = append(dst, lit...)
				}
				return dst, nil
			}
		}
		return dst, s.syntax("in literal")
	case c == '-' || c >= '0' && c <= '9':
		start := s.i
		for s.i < len(s.b) && strings.IndexByte("+-.eE0123456789", s.b[s.i]) >= 0 {
			s.i++
		}
		num := s.b[start:s.i]
		if !validNumber(unsafe.String(unsafe.SliceData(num), len(num))) {
			return dst, fmt.Errorf("invalid number %q at offset %d", num, start)
		}
		if emit {
			dst = append(dst, num...)
		}
		return dst, nil
	default:
		return dst, s.syntax("looking for beginning of value")
	}
}

// open reads a container's opening bracket (writing it when emitting) and
// the space after it, and reports whether the container is empty: then it
// has read and written the closing bracket too.
func (s *jsonScanner) open(dst []byte, opening, closing byte, emit bool) ([]byte, bool) {
	s.i++
	if emit {
		dst = append(dst, opening)
	}
	s.space()
	if s.i < len(s.b) && s.b[s.i] == closing {
		s.i++
		if emit {
			dst = append(dst, closing)
		}
		return dst, true
	}
	return dst, false
}

func (s *jsonScanner) array(dst []byte, depth int, emit bool) ([]byte, error) {
	dst, empty := s.open(dst, '[', ']', emit)
	if empty {
		return dst, nil
	}
	for n := 0; ; n++ {
		if n > 0 && emit {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = s.value(dst, depth+1, emit); err != nil {
			return dst, err
		}
		s.space()
		if s.i >= len(s.b) {
			return dst, errJSONEnd
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.space()
		case ']':
			s.i++
			if emit {
				dst = append(dst, ']')
			}
			return dst, nil
		default:
			return dst, s.syntax("after array element")
		}
	}
}

// object reads an object. Emitting, it writes each member as it reads it
// (every value is read once, however deep it sits), noting where each
// starts and ends in dst on the encoder's member stack; when the keys did
// not come in strictly increasing order it then moves the written members
// into key order (reorder), copying bytes rather than reading the values
// again. Before, the members were skipped once to sort them and then read
// again to be written, so a document nested n deep was read n+1 times.
func (s *jsonScanner) object(dst []byte, depth int, emit bool) ([]byte, error) {
	e := s.e
	start := len(e.members)
	defer func() {
		clear(e.members[start:])
		e.members = e.members[:start]
	}()
	from := len(dst) + 1 // where the members start
	dst, empty := s.open(dst, '{', '}', emit)
	if empty {
		return dst, nil
	}
	inOrder := true
	for n := 0; ; n++ {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return dst, s.syntax("looking for beginning of object key string")
		}
		key, _, err := s.str()
		if err != nil {
			return dst, err
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return dst, s.syntax("after object key")
		}
		s.i++
		s.space()
		if !emit {
			if _, err := s.value(nil, depth+1, false); err != nil {
				return dst, err
			}
		} else {
			if n > 0 {
				dst = append(dst, ',')
			}
			at := len(dst)
			if dst, err = appendString(dst, key); err != nil {
				return dst, err
			}
			dst = append(dst, ':')
			if dst, err = s.value(dst, depth+1, true); err != nil {
				return dst, err
			}
			if n > 0 && e.members[len(e.members)-1].key >= key {
				inOrder = false
			}
			e.members = append(e.members, member{key: key, at: at, end: len(dst)})
		}
		s.space()
		if s.i >= len(s.b) {
			return dst, errJSONEnd
		}
		if s.b[s.i] == '}' {
			s.i++
			break
		}
		if s.b[s.i] != ',' {
			return dst, s.syntax("after object key:value pair")
		}
		s.i++
		s.space()
	}
	if !emit {
		return dst, nil
	}
	if !inOrder {
		dst = e.reorder(dst, from, e.members[start:])
	}
	return append(dst, '}'), nil
}

// reorder rewrites the members written from dst[from:] on (`"key":value`
// each, comma-separated, at ms's offsets) sorted bytewise by their decoded
// keys, keeping only the last of equal keys, as MySQL 8 does.
func (e *encoder) reorder(dst []byte, from int, ms []member) []byte {
	e.scratch = append(e.scratch[:0], dst[from:]...)
	slices.SortStableFunc(ms, func(a, b member) int { return strings.Compare(a.key, b.key) })
	dst = dst[:from]
	first := true
	for j, m := range ms {
		if j+1 < len(ms) && ms[j+1].key == m.key {
			continue // a later duplicate wins
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, e.scratch[m.at-from:m.end-from]...)
	}
	return dst
}

// str reads a string token and returns its decoded value: a view of the
// document's bytes when it has no escapes (plain), a new string otherwise.
// Like encoding/json, an escaped lone or mismatched surrogate decodes to
// U+FFFD; a control character is an error.
func (s *jsonScanner) str() (string, bool, error) {
	s.i++ // '"'
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			return unsafe.String(unsafe.SliceData(v), len(v)), true, nil
		case c == '\\':
			return s.escaped(start)
		case c < 0x20:
			return "", false, s.syntax("in string literal")
		default:
			s.i++
		}
	}
	return "", false, errJSONEnd
}

func (s *jsonScanner) escaped(start int) (string, bool, error) {
	out := append(make([]byte, 0, s.i-start+16), s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return string(out), false, nil
		case c < 0x20:
			return "", false, s.syntax("in string literal")
		case c != '\\':
			out = append(out, c)
			s.i++
			continue
		}
		if s.i+1 >= len(s.b) {
			return "", false, errJSONEnd
		}
		s.i++
		switch s.b[s.i] {
		case '"', '\\', '/':
			out = append(out, s.b[s.i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := s.hex4(s.i + 1)
			if r < 0 {
				return "", false, s.syntax("in \\u escape")
			}
			s.i += 4
			if utf16.IsSurrogate(r) {
				if s.i+2 < len(s.b) && s.b[s.i+1] == '\\' && s.b[s.i+2] == 'u' {
					if r2 := s.hex4(s.i + 3); r2 >= 0 {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							out = utf8.AppendRune(out, d)
							s.i += 7
							continue
						}
					}
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", false, s.syntax("in string escape code")
		}
		s.i++
	}
	return "", false, errJSONEnd
}

// hex4 is the value of the four hex digits at b[at:], or -1.
func (s *jsonScanner) hex4(at int) rune {
	if at+4 > len(s.b) {
		return -1
	}
	var r rune
	for _, c := range s.b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// ValidJSON reports whether b is one JSON document that the canonical
// encoder accepts (valid UTF-8, nesting within its bound), so a decoder
// can refuse a bad document where it reads it rather than where the
// envelope is written.
func ValidJSON(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	e := getEncoder()
	defer putEncoder(e)
	s := jsonScanner{b: b, e: e}
	s.space()
	if _, err := s.value(nil, 0, false); err != nil {
		return false
	}
	s.space()
	return s.i == len(b)
}
