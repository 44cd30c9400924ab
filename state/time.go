package state

import (
	"fmt"
	"time"
)

// Time scans a DATETIME column whether or not the DSN sets parseTime=true
// (the state tables are read through DSNs users write). Zone-less values
// are UTC: state.Open runs every session in UTC. NULL scans as the zero time.
type Time struct{ T time.Time }

// Scan implements sql.Scanner.
func (s *Time) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		s.T = time.Time{}
		return nil
	case time.Time:
		s.T = x
		return nil
	case []byte:
		return s.parse(string(x))
	case string:
		return s.parse(x)
	}
	return fmt.Errorf("cannot scan %T as a time", v)
}

func (s *Time) parse(v string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", v, time.UTC)
	if err != nil {
		return fmt.Errorf("parse time %q: %w", v, err)
	}
	s.T = t
	return nil
}
