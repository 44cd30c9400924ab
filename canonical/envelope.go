package canonical

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// MarshalEnvelope returns the Debezium-compatible envelope of c as canonical
// JSON:
//
//	{"after":…,"before":…,"change_key":…,"id":…,"key":…,"op":…,
//	 "source":{"connector","db","file","gtid","instance","pos","row",
//	           "server_id","table","ts_ms","version"},"ts_ms":…}
//
// "id" (the delivery key) is present only when id != "". Keys are written
// in sorted order directly, without a map, because this runs once per change
// on the hot path.
func MarshalEnvelope(c *Change, id string) ([]byte, error) {
	// Sized for the images up front (base64 is 4/3): grown by appends, a
	// wide row's envelope would be copied as it grows, the old and the new
	// buffer live at once.
	return AppendEnvelope(make([]byte, 0, 512+c.ImageBytes()*4/3), c, id)
}

// AppendEnvelope appends the envelope of c (see MarshalEnvelope) to dst.
func AppendEnvelope(dst []byte, c *Change, id string) ([]byte, error) {
	return appendEnvelope(dst, c, id, nil)
}

// appendEnvelope is AppendEnvelope, with c's images taken from im when
// it is not nil (EncodeImages of c).
func appendEnvelope(dst []byte, c *Change, id string, im *Images) ([]byte, error) {
	if c == nil {
		return dst, errors.New("canonical json: nil change")
	}
	switch c.Op {
	case OpCreate, OpUpdate, OpDelete, OpRead:
	case OpTransaction:
		if c.Tx == nil {
			return dst, errors.New("canonical json: transaction record without its transaction")
		}
	case OpDDL:
		if c.DDL == nil {
			return dst, errors.New("canonical json: schema-change record without its statement")
		}
	default:
		return dst, fmt.Errorf("canonical json: invalid op %q", string(c.Op))
	}
	e := getEncoder()
	defer putEncoder(e)
	orig := dst
	var err error
	dst = append(dst, `{"after":`...)
	if im != nil {
		dst = append(dst, im.After...)
		dst = append(dst, `,"before":`...)
		dst = append(dst, im.Before...)
	} else {
		if dst, err = e.object(dst, c.After, 0); err != nil {
			return orig, fmt.Errorf("encode after: %w", err)
		}
		dst = append(dst, `,"before":`...)
		if dst, err = e.object(dst, c.Before, 0); err != nil {
			return orig, fmt.Errorf("encode before: %w", err)
		}
	}
	dst = append(dst, `,"change_key":`...)
	if dst, err = appendString(dst, c.ChangeKey); err != nil {
		return orig, fmt.Errorf("encode change_key: %w", err)
	}
	if c.DDL != nil {
		dst = append(dst, `,"ddl":`...)
		if dst, err = AppendJSON(dst, c.DDL.doc()); err != nil {
			return orig, fmt.Errorf("encode ddl: %w", err)
		}
	}
	if id != "" {
		dst = append(dst, `,"id":`...)
		if dst, err = appendString(dst, id); err != nil {
			return orig, fmt.Errorf("encode id: %w", err)
		}
	}
	dst = append(dst, `,"key":`...)
	if dst, err = e.key(dst, c); err != nil {
		return orig, fmt.Errorf("encode key: %w", err)
	}
	dst = append(dst, `,"op":"`...)
	switch c.Op {
	case OpTransaction:
		dst = append(dst, TransactionOpName...)
	case OpDDL:
		dst = append(dst, DDLOpName...)
	default:
		dst = append(dst, c.Op...)
	}
	s := &c.Source
	dst = append(dst, `","source":{"connector":`...)
	if dst, err = appendString(dst, s.Connector); err != nil {
		return orig, fmt.Errorf("encode source.connector: %w", err)
	}
	dst = append(dst, `,"db":`...)
	if dst, err = appendString(dst, s.DB); err != nil {
		return orig, fmt.Errorf("encode source.db: %w", err)
	}
	dst = append(dst, `,"file":`...)
	if dst, err = appendString(dst, s.File); err != nil {
		return orig, fmt.Errorf("encode source.file: %w", err)
	}
	dst = append(dst, `,"gtid":`...)
	if dst, err = appendString(dst, s.GTID); err != nil {
		return orig, fmt.Errorf("encode source.gtid: %w", err)
	}
	dst = append(dst, `,"instance":`...)
	if dst, err = appendString(dst, s.Instance); err != nil {
		return orig, fmt.Errorf("encode source.instance: %w", err)
	}
	dst = append(dst, `,"pos":`...)
	dst = strconv.AppendUint(dst, uint64(s.Pos), 10)
	dst = append(dst, `,"row":`...)
	dst = strconv.AppendInt(dst, int64(s.Row), 10)
	dst = append(dst, `,"server_id":`...)
	dst = strconv.AppendUint(dst, uint64(s.ServerID), 10)
	dst = append(dst, `,"table":`...)
	if dst, err = appendString(dst, s.Table); err != nil {
		return orig, fmt.Errorf("encode source.table: %w", err)
	}
	dst = append(dst, `,"ts_ms":`...)
	dst = strconv.AppendInt(dst, s.TsMs, 10)
	if s.Tx != nil {
		dst = append(dst, `,"tx":`...)
		dst = s.Tx.appendJSON(dst)
	}
	dst = append(dst, `,"version":`...)
	if dst, err = appendString(dst, s.Version); err != nil {
		return orig, fmt.Errorf("encode source.version: %w", err)
	}
	dst = append(dst, `},"ts_ms":`...)
	dst = strconv.AppendInt(dst, c.TsMs, 10)
	if c.Tx != nil {
		dst = append(dst, `,"tx":`...)
		if dst, err = AppendJSON(dst, c.Tx.doc()); err != nil {
			return orig, fmt.Errorf("encode tx: %w", err)
		}
	}
	return append(dst, '}'), nil
}

// envelopeJSON is the decoding shape of an envelope.
type envelopeJSON struct {
	After     Row     `json:"after"`
	Before    Row     `json:"before"`
	ChangeKey string  `json:"change_key"`
	ID        string  `json:"id"`
	Key       Row     `json:"key"`
	Op        Op      `json:"op"`
	Source    *Source `json:"source"`
	TsMs      int64   `json:"ts_ms"`
}

// UnmarshalEnvelope parses an envelope written by MarshalEnvelope and
// returns the change and its id ("" when absent). Row values come back as
// generic JSON values (json.Number for numbers, string for base64 bytes,
// map[string]any and []any for JSON columns), which re-marshal to the same
// bytes: MarshalEnvelope(UnmarshalEnvelope(b)) == b for canonical b.
func UnmarshalEnvelope(b []byte) (*Change, string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var env envelopeJSON
	if err := dec.Decode(&env); err != nil {
		return nil, "", fmt.Errorf("decode envelope: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, "", errors.New("decode envelope: trailing data after the envelope")
	}
	switch env.Op {
	case OpCreate, OpUpdate, OpDelete, OpRead:
	default:
		return nil, "", fmt.Errorf("decode envelope: invalid op %q", string(env.Op))
	}
	if env.Source == nil {
		return nil, "", errors.New("decode envelope: missing source")
	}
	return &Change{
		Op:        env.Op,
		Before:    env.Before,
		After:     env.After,
		Key:       env.Key,
		Source:    *env.Source,
		TsMs:      env.TsMs,
		ChangeKey: env.ChangeKey,
	}, env.ID, nil
}

// KeyJSON returns the canonical JSON of a change key, "null" for a nil key
// (a table without a primary or NOT NULL unique key). Key values must be
// canonical values; one that cannot be encoded (which binlog's decoder never
// produces) yields "".
func KeyJSON(key Row) string { return KeyJSONOf(&Change{Key: key}) }

// KeyJSONOf is KeyJSON of a change's key, in either of its forms (Key or
// KeyCols).
func KeyJSONOf(c *Change) string {
	e := getEncoder()
	defer putEncoder(e)
	b, err := e.key(make([]byte, 0, 64), c)
	if err != nil {
		return ""
	}
	return string(b)
}

// Digest is the change digest of digest mode (docs/ARCHITECTURE.md, "Change identity"): the hex SHA-256 of
// the canonical JSON of {"key":key,"next":next,"op":op,"pipe":pipe,
// "prev":prev}, where next is the row after the change and prev the row
// before it (nil rows are null). Two replicas that decoded the same change
// the same way get the same digest. Row values must be canonical values;
// one that cannot be encoded yields "" (binlog's decoder never produces
// such values, and MarshalEnvelope reports them as errors).
func Digest(pipe string, op Op, key, next, prev Row) string {
	return DigestChange(pipe, &Change{Op: op, Key: key, After: next, Before: prev})
}

// DigestChange is Digest of a change: its key (either form), After as next
// and Before as prev.
func DigestChange(pipe string, c *Change) string {
	return digest(pipe, c, nil)
}

func digest(pipe string, c *Change, im *Images) string {
	bp := digestBuffers.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooledDigestInput {
			digestBuffers.Put(bp)
		}
	}()
	b, err := appendDigestInput((*bp)[:0], pipe, c, im)
	*bp = b
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// digestBuffers hold the documents digest hashes, which are dropped as
// soon as they are hashed: one allocation per change (its images' size)
// was a twentieth of cdcout's allocation on realistic rows
// (BenchmarkFileEndToEnd's profile). A buffer grown past
// maxPooledDigestInput by a wide row is not kept.
var digestBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

const maxPooledDigestInput = 256 << 10

// appendDigestInput appends the document DigestChange hashes to dst, with
// c's images from im when it is not nil.
func appendDigestInput(dst []byte, pipe string, c *Change, im *Images) ([]byte, error) {
	e := getEncoder()
	defer putEncoder(e)
	orig := dst
	var err error
	dst = append(dst, `{"key":`...)
	if dst, err = e.key(dst, c); err != nil {
		return orig, fmt.Errorf("encode key: %w", err)
	}
	next, op, prev := c.After, c.Op, c.Before
	dst = append(dst, `,"next":`...)
	if im != nil {
		dst = append(dst, im.After...)
	} else if dst, err = e.object(dst, next, 0); err != nil {
		return orig, fmt.Errorf("encode next: %w", err)
	}
	dst = append(dst, `,"op":`...)
	if dst, err = appendString(dst, string(op)); err != nil {
		return orig, fmt.Errorf("encode op: %w", err)
	}
	dst = append(dst, `,"pipe":`...)
	if dst, err = appendString(dst, pipe); err != nil {
		return orig, fmt.Errorf("encode pipe: %w", err)
	}
	dst = append(dst, `,"prev":`...)
	if im != nil {
		dst = append(dst, im.Before...)
	} else if dst, err = e.object(dst, prev, 0); err != nil {
		return orig, fmt.Errorf("encode prev: %w", err)
	}
	return append(dst, '}'), nil
}
