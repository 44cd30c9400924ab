package format

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cdcout/cdcout/outbox"
)

// UnescapeBraces turns percent-encoded template braces ("%7B db %7D", as a
// URL library may write them) back into "{" and "}".
func UnescapeBraces(tmpl string) string {
	return strings.NewReplacer("%7B", "{", "%7b", "{", "%7D", "}", "%7d", "}").Replace(tmpl)
}

// A Template is a compiled destination name template (a Kafka topic, a
// NATS subject, a Redis stream key, a Pub/Sub topic). Its placeholders:
//
//	{db} {table} {instance}  the record's values
//	{key}                    the record's key values (the sink's key:
//	                         columns, else the row key), in order, joined by "."
//	{col:NAME}               column NAME of the row: the after image, the
//	                         before image for a delete
//
// Each value is passed through the destination's clean function so that it
// fits its alphabet. A row without the column is an error for that record
// (the sink dead-letters it with the reason), never "".
type Template struct {
	parts []templatePart
	cols  []string
}

type templatePart struct {
	literal string
	// field is "db", "table", "instance", "key" or "col"; "" for a literal.
	field, col string
}

// ParseTemplate compiles tmpl. An unknown placeholder or an unclosed brace
// is an error naming it.
func ParseTemplate(tmpl string) (*Template, error) {
	t := &Template{}
	rest := tmpl
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			t.parts = append(t.parts, templatePart{literal: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, templatePart{literal: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("template %q: %q has no closing brace", tmpl, rest[i:])
		}
		name := rest[i+1 : i+j]
		rest = rest[i+j+1:]
		switch {
		case name == "db" || name == "table" || name == "instance" || name == "key":
			t.parts = append(t.parts, templatePart{field: name})
		case strings.HasPrefix(name, "col:") && len(name) > len("col:"):
			col := name[len("col:"):]
			t.parts = append(t.parts, templatePart{field: "col", col: col})
			t.cols = append(t.cols, col)
		default:
			return nil, fmt.Errorf("template %q: unknown placeholder {%s} (want {db}, {table}, {instance}, {key} or {col:NAME})", tmpl, name)
		}
	}
	return t, nil
}

// Columns are the row columns the template names ({col:NAME}).
func (t *Template) Columns() []string { return t.cols }

// Expand returns the name for rec, each value passed through clean.
func (t *Template) Expand(rec outbox.Record, clean func(string) string) (string, error) {
	if len(t.parts) == 1 && t.parts[0].field == "" {
		return t.parts[0].literal, nil
	}
	var (
		b   strings.Builder
		row Row
	)
	for _, p := range t.parts {
		switch p.field {
		case "":
			b.WriteString(p.literal)
		case "db":
			b.WriteString(clean(rec.DB))
		case "table":
			b.WriteString(clean(rec.Table))
		case "instance":
			b.WriteString(clean(Instance(rec)))
		case "key":
			vals, err := KeyValues(rec.Key)
			if err != nil {
				return "", fmt.Errorf("{key}: %w", err)
			}
			for i, v := range vals {
				if i > 0 {
					b.WriteByte('.')
				}
				b.WriteString(clean(v))
			}
		case "col":
			if row == nil {
				var err error
				if row, err = RowOf(rec); err != nil {
					return "", fmt.Errorf("{col:%s}: %w", p.col, err)
				}
			}
			v, ok := row[p.col]
			if !ok {
				return "", &MissingColumnError{Column: p.col, What: "the name template", Rec: rec}
			}
			s, err := ValueText(v)
			if err != nil {
				return "", fmt.Errorf("{col:%s}: %w", p.col, err)
			}
			b.WriteString(clean(s))
		}
	}
	return b.String(), nil
}

// NameTemplate compiles tmpl for a sink whose templates were checked by
// configuration validation; a template that does not compile (a sink
// built by hand) expands to an error for every record.
func NameTemplate(tmpl string, clean func(string) string) func(outbox.Record) (string, error) {
	t, err := ParseTemplate(tmpl)
	if err != nil {
		return func(outbox.Record) (string, error) { return "", err }
	}
	return func(rec outbox.Record) (string, error) { return t.Expand(rec, clean) }
}

// EncodeNamed encodes rec in f and names its destination with name (a
// NameTemplate), for the sinks that publish each record to a destination
// of its own (Kafka and Pub/Sub topics, NATS subjects, Redis streams).
// An error is the record's for good, to be made sink.Permanent: the
// stored payload and the sink's template are the same on every retry.
func EncodeNamed(f Format, rec outbox.Record, name func(outbox.Record) (string, error)) (body []byte, dest string, err error) {
	if body, err = f.Encode(rec); err != nil {
		return nil, "", err
	}
	if dest, err = name(rec); err != nil {
		return nil, "", err
	}
	return body, dest, nil
}

// MissingColumnError is a record whose row lacks a column its sink's key
// or name template needs: the record is dead-lettered with this reason.
type MissingColumnError struct {
	Column, What string
	Rec          outbox.Record
}

func (e *MissingColumnError) Error() string {
	return fmt.Sprintf("column %q of %s is not in this row of %s.%s (op %s); the record cannot be routed",
		e.Column, e.What, e.Rec.DB, e.Rec.Table, e.Rec.Op)
}

// ErrNoRow is returned for a record that carries no row image (a
// heartbeat or a transaction's BEGIN or END).
var ErrNoRow = errors.New("the record has no row image")

// CEAttributes are a record's CloudEvents attributes as message
// attributes (the Kafka binding's ce_ prefix), for brokers whose message
// metadata is a string map.
func CEAttributes(rec outbox.Record, contentType string) map[string]string {
	a := map[string]string{
		"ce_id":          rec.ID,
		"ce_specversion": CESpecVersion,
		"ce_type":        CEType(rec),
		"ce_source":      CESource(rec),
		"ce_subject":     CESubject(rec),
		"content-type":   contentType,
	}
	if t := CETime(rec); t != "" {
		a["ce_time"] = t
	}
	return a
}
