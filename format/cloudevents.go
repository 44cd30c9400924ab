package format

import (
	"fmt"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// cloudEventsFormat wraps the envelope in a structured-mode CloudEvent
// (https://github.com/cloudevents/spec, JSON event format): the event's
// attributes and, under "data", the envelope itself.
type cloudEventsFormat struct{}

func (cloudEventsFormat) ContentType() string { return "application/cloudevents+json" }

func (cloudEventsFormat) Encode(rec outbox.Record) ([]byte, error) {
	ev := map[string]any{
		"specversion":     CESpecVersion,
		"id":              rec.ID,
		"source":          CESource(rec),
		"type":            CEType(rec),
		"subject":         CESubject(rec),
		"datacontenttype": "application/json",
		"data":            canonical.RawJSON(rec.Payload),
	}
	if t := CETime(rec); t != "" {
		ev["time"] = t
	}
	b, err := marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode cloudevent %s: %w", rec.ID, err)
	}
	return b, nil
}
