package format

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// Row is one row image of a record, column name → canonical JSON value.
type Row map[string]json.RawMessage

// RowOf reads the row a record is about from its stored envelope: the
// after image, or the before image for a delete. The envelope carries the
// sink's column transforms already, so a hashed column's value is its
// hash. It parses the payload: sinks call it only when a key: or a
// {col:…} template asks for columns.
func RowOf(rec outbox.Record) (Row, error) {
	switch rec.Op {
	case canonical.OpCreate, canonical.OpUpdate, canonical.OpDelete, canonical.OpRead:
	default:
		return nil, ErrNoRow
	}
	var env struct {
		After  Row `json:"after"`
		Before Row `json:"before"`
	}
	if err := json.Unmarshal(rec.Payload, &env); err != nil {
		return nil, fmt.Errorf("read the row of record %s: %w", rec.ID, err)
	}
	if env.After != nil {
		return env.After, nil
	}
	if env.Before != nil {
		return env.Before, nil
	}
	return nil, ErrNoRow
}

// MessageKey returns the key: columns of rec's row as a JSON object in
// the order of cols ({"customer_id":7,"region":"eu"}), the values as the
// envelope holds them. A row without one of the columns is a
// *MissingColumnError.
func MessageKey(rec outbox.Record, cols []string) (string, error) {
	row, err := RowOf(rec)
	if err != nil {
		return "", err
	}
	b := make([]byte, 0, 64)
	b = append(b, '{')
	for i, c := range cols {
		v, ok := row[c]
		if !ok {
			return "", &MissingColumnError{Column: c, What: "the sink's key", Rec: rec}
		}
		if i > 0 {
			b = append(b, ',')
		}
		name, _ := json.Marshal(c) // a string always marshals
		b = append(append(append(b, name...), ':'), v...)
	}
	return string(append(b, '}')), nil
}

// KeyValues are the values of a key's JSON object (a row key or a
// MessageKey) as text, in the object's order; "null" (a keyless table's
// key) is the one value "null".
func KeyValues(key string) ([]string, error) {
	if key == "" || key == "null" {
		return []string{"null"}, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(key)))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("key %q is not a JSON object", key)
	}
	var out []string
	for dec.More() {
		if _, err := dec.Token(); err != nil { // the column name
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		s, err := ValueText(v)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// ValueText is a canonical JSON value as text in a name: a string
// unquoted, a number, true, false or null as written, an object or an
// array as its JSON.
func ValueText(v json.RawMessage) (string, error) {
	if len(v) > 0 && v[0] == '"' {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", fmt.Errorf("value %s: %w", v, err)
		}
		return s, nil
	}
	return string(v), nil
}
