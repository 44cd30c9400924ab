package canonical

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// Marshal returns the canonical JSON of v: object keys sorted bytewise at
// every depth, no insignificant whitespace, one representation per value.
//
// v must be built from the canonical value types: nil, bool, the Go integer
// types (int64 and uint64 are what the decoder produces), float32 (printed as
// the shortest decimal that round-trips at 32 bits), float64 (shortest
// round-trip at 64 bits; NaN and ±Inf are an error, JSON has no such
// numbers), string (must be valid UTF-8), json.Number (validated, kept as
// written), RawJSON (re-emitted canonically), []byte (standard base64 with
// padding), Row / map[string]any, []any and []string. Anything else is an
// error rather than a guess, so a decoder bug cannot turn into silently
// different bytes on two replicas.
func Marshal(v any) ([]byte, error) {
	return AppendJSON(make([]byte, 0, 64), v)
}

// AppendJSON appends the canonical JSON of v (see Marshal) to dst. On error
// the returned slice is dst as it was passed in.
func AppendJSON(dst []byte, v any) ([]byte, error) {
	e := getEncoder()
	defer putEncoder(e)
	out, err := e.value(dst, v)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// encoder carries the scratch space of one Marshal call. keys is used as a
// stack: an object pushes its keys, sorts its own segment and pops it when
// done, so nested objects share one backing array and a warm encoder sorts
// without allocating.
//
// orders remembers the sorted key lists of the last few top-level objects
// (row images and keys, whose column names repeat from change to change)
// with their encoded names, so the next object with the same key set skips
// collecting, sorting and escaping its keys. The output is the same bytes
// either way: an order is only reused for exactly its own key set.
type encoder struct {
	keys    []string
	vals    []any
	members []member // rawJSON's objects' members, a stack like keys
	scratch []byte   // rawJSON's members being put in key order
	images  []byte   // EncodeImages' working buffer
	orders  [numOrders]keyOrder
	next    int // the orders slot the next miss overwrites
}

// numOrders covers the after/before image and the key of a few tables
// written in turn; a miss costs what encoding cost before the cache.
const numOrders = 8

// Bounds on what an order may hold, so one wide table does not pin much
// memory in the pool.
const (
	maxOrderKeys  = 256
	maxOrderBytes = 8 << 10
)

// keyOrder is one remembered key set: keys sorted, and names holding
// `"key":` for each of them back to back, ends[i] ending keys[i]'s.
type keyOrder struct {
	keys  []string
	names []byte
	ends  []int
}

var encoderPool = sync.Pool{New: func() any { return &encoder{keys: make([]string, 0, 32)} }}

func getEncoder() *encoder { return encoderPool.Get().(*encoder) }

func putEncoder(e *encoder) {
	if cap(e.keys) > 1<<12 {
		// Do not pin the key slice of one huge document forever.
		e.keys = make([]string, 0, 32)
	}
	if cap(e.vals) > 1<<12 {
		e.vals = nil
	}
	if cap(e.members) > 1<<12 {
		e.members = nil
	}
	if cap(e.scratch) > 64<<10 {
		e.scratch = nil
	}
	if cap(e.images) > 64<<10 {
		e.images = nil
	}
	// Every object clears the keys and values it pushed when it pops them,
	// also on errors, so a pooled encoder holds no references (clearing
	// the whole capacity here cost more than the rest of a small object).
	e.keys, e.vals, e.members = e.keys[:0], e.vals[:0], e.members[:0]
	encoderPool.Put(e)
}

// maxDepth bounds nesting so a hostile JSON document cannot exhaust the
// stack; MySQL itself limits JSON documents to a depth of 100.
const maxDepth = 1000

func (e *encoder) value(dst []byte, v any) ([]byte, error) {
	return e.valueDepth(dst, v, 0)
}

func (e *encoder) valueDepth(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return dst, errors.New("canonical json: nesting too deep")
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case string:
		return appendString(dst, x)
	case int64:
		return strconv.AppendInt(dst, x, 10), nil
	case uint64:
		return strconv.AppendUint(dst, x, 10), nil
	case Row:
		return e.object(dst, x, depth)
	case map[string]any:
		return e.object(dst, x, depth)
	case []any:
		dst = append(dst, '[')
		for i, el := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = e.valueDepth(dst, el, depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case []string:
		dst = append(dst, '[')
		for i, el := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendString(dst, el); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case bool:
		if x {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case float64:
		return appendFloat(dst, x, 64)
	case float32:
		return appendFloat(dst, float64(x), 32)
	case json.Number:
		if !validNumber(string(x)) {
			return dst, fmt.Errorf("canonical json: invalid number %q", string(x))
		}
		return append(dst, x...), nil
	case RawJSON:
		return e.rawJSON(dst, x, depth)
	case []byte:
		n := base64.StdEncoding.EncodedLen(len(x))
		dst = append(dst, '"')
		dst = slices.Grow(dst, n+1)
		l := len(dst)
		dst = dst[:l+n]
		base64.StdEncoding.Encode(dst[l:], x)
		return append(dst, '"'), nil
	case int:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int8:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int16:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int32:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint8:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint16:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint32:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	default:
		return dst, fmt.Errorf("canonical json: unsupported value type %T", v)
	}
}

func (e *encoder) object(dst []byte, m map[string]any, depth int) ([]byte, error) {
	if m == nil {
		// A nil Row is "no row image" (an insert's before), not an
		// empty object.
		return append(dst, "null"...), nil
	}
	if depth == 0 {
		if o := e.order(m); o != nil {
			return e.objectInOrder(dst, o, depth)
		}
	}
	start := len(e.keys)
	for k := range m {
		e.keys = append(e.keys, k)
	}
	slices.Sort(e.keys[start:])
	if depth == 0 {
		e.remember(e.keys[start:])
	}
	dst = append(dst, '{')
	var err error
	for i := start; i < len(e.keys); i++ {
		// Re-read e.keys each round: a nested object may have grown
		// (and so moved) the backing array.
		k := e.keys[i]
		if i > start {
			dst = append(dst, ',')
		}
		if dst, err = appendString(dst, k); err != nil {
			clear(e.keys[start:])
			e.keys = e.keys[:start]
			return dst, err
		}
		dst = append(dst, ':')
		if dst, err = e.valueDepth(dst, m[k], depth+1); err != nil {
			clear(e.keys[start:])
			e.keys = e.keys[:start]
			return dst, err
		}
	}
	clear(e.keys[start:])
	e.keys = e.keys[:start]
	return append(dst, '}'), nil
}

// order returns the remembered order whose key set is exactly m's, with
// m's values pushed onto e.vals in that order, or nil.
func (e *encoder) order(m map[string]any) *keyOrder {
	for i := range e.orders {
		o := &e.orders[i]
		if len(o.keys) != len(m) || len(o.keys) == 0 {
			continue
		}
		// The keys of an order are distinct and as many as m's: if m
		// has all of them, it has no others.
		start := len(e.vals)
		hit := true
		for _, k := range o.keys {
			v, ok := m[k]
			if !ok {
				hit = false
				break
			}
			e.vals = append(e.vals, v)
		}
		if hit {
			return o
		}
		clear(e.vals[start:])
		e.vals = e.vals[:start]
	}
	return nil
}

// objectInOrder writes the object whose values order pushed.
// key encodes a change's key: Key, or {col: image[col], …} over the sorted
// KeyCols without building a map.
func (e *encoder) key(dst []byte, c *Change) ([]byte, error) {
	if c.Key != nil || len(c.KeyCols) == 0 {
		return e.object(dst, c.Key, 0)
	}
	img := c.keyImage()
	dst = append(dst, '{')
	var err error
	for i, k := range c.KeyCols {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendString(dst, k); err != nil {
			return dst, err
		}
		dst = append(dst, ':')
		if dst, err = e.valueDepth(dst, img[k], 1); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func (e *encoder) objectInOrder(dst []byte, o *keyOrder, depth int) ([]byte, error) {
	start := len(e.vals) - len(o.keys)
	dst = append(dst, '{')
	prev := 0
	var err error
	for i, end := range o.ends {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, o.names[prev:end]...)
		prev = end
		// Re-read e.vals each round: a nested value may have grown it.
		if dst, err = e.valueDepth(dst, e.vals[start+i], depth+1); err != nil {
			break
		}
	}
	clear(e.vals[start:])
	e.vals = e.vals[:start]
	if err != nil {
		return dst, err
	}
	return append(dst, '}'), nil
}

// remember stores sorted keys as an order, reusing the storage of the
// slot it overwrites. Keys that are not valid UTF-8 are not remembered:
// their object is an error, and stays one.
func (e *encoder) remember(keys []string) {
	if len(keys) == 0 || len(keys) > maxOrderKeys {
		return
	}
	o := &e.orders[e.next]
	// Emptied first: names below reuses its storage, and an order must
	// never pair keys with another set's names.
	o.keys = o.keys[:0]
	names, ends := o.names[:0], o.ends[:0]
	for _, k := range keys {
		var err error
		if names, err = appendString(names, k); err != nil || len(names) > maxOrderBytes {
			return
		}
		names = append(names, ':')
		ends = append(ends, len(names))
	}
	o.keys = append(o.keys[:0], keys...)
	o.names, o.ends = names, ends
	e.next = (e.next + 1) % numOrders
}

// ParseJSON decodes one JSON document into generic values (map[string]any,
// []any, string, bool, nil and json.Number for numbers). Trailing data after
// the document is an error.
func ParseJSON(raw []byte) (any, error) {
	if !utf8.Valid(raw) {
		// encoding/json would silently replace bad bytes with U+FFFD.
		return nil, errors.New("canonical json: JSON document is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical json: parse JSON document: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonical json: parse JSON document: trailing data after the document")
	}
	return v, nil
}

// appendFloat writes the shortest decimal that parses back to f at the given
// bit size, in the same notation as encoding/json (and ECMAScript): plain
// decimal for 1e-6 <= |f| < 1e21, exponent form otherwise.
func appendFloat(dst []byte, f float64, bits int) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, fmt.Errorf("canonical json: unsupported float value %v", f)
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) ||
			bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	n := len(dst)
	dst = strconv.AppendFloat(dst, f, format, -1, bits)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		if m := len(dst) - n; m >= 4 && dst[len(dst)-4] == 'e' && dst[len(dst)-3] == '-' && dst[len(dst)-2] == '0' {
			dst[len(dst)-2] = dst[len(dst)-1]
			dst = dst[:len(dst)-1]
		}
	}
	return dst, nil
}

const hexDigits = "0123456789abcdef"

// safeASCII marks the bytes below utf8.RuneSelf that need no escaping.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for i := 0x20; i < utf8.RuneSelf; i++ {
		t[i] = i != '"' && i != '\\'
	}
	return t
}()

// appendString writes s as a JSON string with RFC 8259's minimal escaping:
// only '"', '\\' and control characters below U+0020. Unlike encoding/json
// it does not HTML-escape <, > and &, and it keeps U+2028/U+2029 literal:
// every escape choice is a byte difference, and fewer choices mean fewer ways
// for two implementations to disagree.
func appendString(dst []byte, s string) ([]byte, error) {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i+8 <= len(s) && plainWord(load8(s, i)) {
			i += 8
			continue
		}
		b := s[i]
		if b < utf8.RuneSelf {
			if safeASCII[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return dst, fmt.Errorf("canonical json: string is not valid UTF-8 at byte %d", i)
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), nil
}

// plainWord reports whether the 8 bytes of w are all ASCII that needs no
// escaping (no control character, '"' or '\\'), testing them at once:
// string values are mostly such text, and the byte loop is the slow part
// of encoding them.
func plainWord(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	ctrl := (w - 0x20*ones) &^ w // a byte below 0x20 sets its high bit
	quote := w ^ '"'*ones        // a '"' becomes a zero byte…
	quote = (quote - ones) &^ quote
	bslash := w ^ '\\'*ones // … and so does a '\\'
	bslash = (bslash - ones) &^ bslash
	return (w|ctrl|quote|bslash)&highs == 0
}

// load8 reads s[i:i+8] as a little-endian word (one load on amd64/arm64).
func load8(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// validNumber reports whether s is a JSON number (RFC 8259 §6).
func validNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			return false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			return false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	return i == len(s)
}
