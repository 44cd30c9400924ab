package replay

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Kind is what a range's bounds are written in.
type Kind string

// The kinds of Point.
const (
	KindGTID    Kind = "gtid"
	KindFilePos Kind = "file:pos"
	KindTime    Kind = "time"
)

// Point is one bound of a replay range: a GTID (MariaDB "domain-server-seq"
// or MySQL "uuid:seq"), a binlog position "file:pos", or an RFC 3339 time.
type Point struct {
	Kind Kind
	// Text is the point as written.
	Text string
	// GTID: Source is the MariaDB domain or the MySQL server uuid
	// (lower case), Seq the sequence number.
	Source string
	Seq    uint64
	// file:pos: Base is the file name without its sequence number, Num
	// that number, Pos the position.
	Base     string
	Num, Pos uint64
	// time: Time.
	Time time.Time
}

var (
	mariaGTID = regexp.MustCompile(`^(\d+)-\d+-(\d+)$`)
	mysqlGTID = regexp.MustCompile(`^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}):(\d+)$`)
	filePos   = regexp.MustCompile(`^(.*?)(\d+):(\d+)$`)
)

// ParsePoint reads s as a GTID, file:pos or RFC 3339 time.
func ParsePoint(s string) (Point, error) {
	s = strings.TrimSpace(s)
	p := Point{Text: s}
	if m := mariaGTID.FindStringSubmatch(s); m != nil {
		seq, err := strconv.ParseUint(m[2], 10, 64)
		if err == nil {
			p.Kind, p.Source, p.Seq = KindGTID, m[1], seq
			return p, nil
		}
	}
	if m := mysqlGTID.FindStringSubmatch(s); m != nil {
		seq, err := strconv.ParseUint(m[2], 10, 64)
		if err == nil {
			p.Kind, p.Source, p.Seq = KindGTID, strings.ToLower(m[1]), seq
			return p, nil
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		p.Kind, p.Time = KindTime, t.UTC()
		return p, nil
	}
	if m := filePos.FindStringSubmatch(s); m != nil && m[1] != "" {
		num, err1 := strconv.ParseUint(m[2], 10, 64)
		pos, err2 := strconv.ParseUint(m[3], 10, 64)
		if err1 == nil && err2 == nil {
			p.Kind, p.Base, p.Num, p.Pos = KindFilePos, m[1], num, pos
			return p, nil
		}
	}
	return p, fmt.Errorf("%q is not a GTID (MariaDB 0-1-42, MySQL 3e11fa47-71ca-11e1-9e33-c80aa9429562:42), "+
		"a binlog position (mysql-bin.000003:1234) or an RFC 3339 time (2026-12-01T17:00:00Z)", s)
}

// Range is what a replay re-delivers: the records from From to To, both
// included; a zero To means every record the outbox held when the replay
// was asked for.
type Range struct {
	From, To Point
}

// ParseRange reads --from and --to (to may be "").
func ParseRange(from, to string) (Range, error) {
	var r Range
	var err error
	if r.From, err = ParsePoint(from); err != nil {
		return r, fmt.Errorf("--from: %w", err)
	}
	if to == "" {
		return r, nil
	}
	if r.To, err = ParsePoint(to); err != nil {
		return r, fmt.Errorf("--to: %w", err)
	}
	switch {
	case r.To.Kind != r.From.Kind:
		return r, fmt.Errorf("--from is a %s and --to a %s: give both as the same kind", r.From.Kind, r.To.Kind)
	case r.From.Kind == KindGTID && r.From.Source != r.To.Source:
		return r, fmt.Errorf("--from %s and --to %s belong to different GTID sources (domain or server uuid); "+
			"a GTID range is one source's sequence numbers (use a time range across sources)", r.From.Text, r.To.Text)
	case r.From.Kind == KindFilePos && r.From.Base != r.To.Base:
		return r, fmt.Errorf("--from %s and --to %s name different binlogs", r.From.Text, r.To.Text)
	case r.To.before(r.From):
		return r, fmt.Errorf("--to %s is before --from %s", r.To.Text, r.From.Text)
	}
	return r, nil
}

// before reports whether p lies before q (same kind and source).
func (p Point) before(q Point) bool {
	switch p.Kind {
	case KindGTID:
		return p.Seq < q.Seq
	case KindFilePos:
		return p.Num < q.Num || (p.Num == q.Num && p.Pos < q.Pos)
	case KindTime:
		return p.Time.Before(q.Time)
	}
	return false
}

// Where is a record's place in the source: what its envelope's source
// says and its commit time.
type Where struct {
	GTID       string
	File       string
	Pos        uint64
	CommitTime time.Time
}

// WhereOf reads a record's place from its envelope.
func WhereOf(payload []byte, commit time.Time) (Where, error) {
	var env struct {
		Source struct {
			GTID string `json:"gtid"`
			File string `json:"file"`
			Pos  uint64 `json:"pos"`
		} `json:"source"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return Where{}, fmt.Errorf("read the record's source: %w", err)
	}
	return Where{GTID: env.Source.GTID, File: env.Source.File, Pos: env.Source.Pos, CommitTime: commit}, nil
}

// at is w as a Point of kind k; ok is false when w has no such place (a
// record without a GTID, say) or one of another source.
func (w Where) at(k Kind, like Point) (Point, bool) {
	switch k {
	case KindGTID:
		p, err := ParsePoint(w.GTID)
		return p, err == nil && p.Kind == KindGTID && p.Source == like.Source
	case KindFilePos:
		p, err := ParsePoint(w.File + ":" + strconv.FormatUint(w.Pos, 10))
		return p, err == nil && p.Kind == KindFilePos && p.Base == like.Base
	case KindTime:
		return Point{Kind: KindTime, Time: w.CommitTime}, !w.CommitTime.IsZero()
	}
	return Point{}, false
}

// Contains reports whether a record at w is in the range. A record that
// has no place of the range's kind and source (no GTID, another GTID
// domain) is not.
func (r Range) Contains(w Where) bool {
	p, ok := w.at(r.From.Kind, r.From)
	if !ok || p.before(r.From) {
		return false
	}
	return r.To.Kind == "" || !r.To.before(p)
}

// Before reports whether a record at w lies before the range's start, in
// the range's own terms; false when it cannot tell (another source).
func (r Range) Before(w Where) bool {
	p, ok := w.at(r.From.Kind, r.From)
	return ok && p.before(r.From)
}

// After reports whether a record at w lies after the range's end; false
// for an open range or when it cannot tell.
func (r Range) After(w Where) bool {
	if r.To.Kind == "" {
		return false
	}
	p, ok := w.at(r.To.Kind, r.To)
	return ok && r.To.before(p)
}

func (r Range) String() string {
	if r.To.Kind == "" {
		return "from " + r.From.Text
	}
	return "from " + r.From.Text + " to " + r.To.Text
}

// StartsBefore reports whether the range starts before a record at w (so
// records between the start and w may be gone); false when it cannot
// tell.
func (r Range) StartsBefore(w Where) bool {
	p, ok := w.at(r.From.Kind, r.From)
	return ok && r.From.before(p)
}
