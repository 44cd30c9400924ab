package format

import (
	"strings"

	"github.com/cdcout/cdcout/outbox"
)

// UnescapeBraces turns percent-encoded template braces ("%7B db %7D", as a
// URL library may write them) back into "{" and "}".
func UnescapeBraces(tmpl string) string {
	return strings.NewReplacer("%7B", "{", "%7b", "{", "%7D", "}", "%7d", "}").Replace(tmpl)
}

// NameTemplate compiles a destination name template (a Kafka topic, a NATS
// subject, a Redis stream key) into a function of the record: {db},
// {table} and {instance} are replaced by the record's values, each passed
// through clean so that it fits the destination's alphabet.
func NameTemplate(tmpl string, clean func(string) string) func(outbox.Record) string {
	if !strings.Contains(tmpl, "{") {
		return func(outbox.Record) string { return tmpl }
	}
	return func(rec outbox.Record) string {
		return strings.NewReplacer(
			"{db}", clean(rec.DB),
			"{table}", clean(rec.Table),
			"{instance}", clean(Instance(rec)),
		).Replace(tmpl)
	}
}

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
