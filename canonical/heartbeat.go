package canonical

import "time"

// OpHeartbeat is the op of a heartbeat record: no row changed; it carries
// the source position and time so consumers of quiet tables see progress.
const OpHeartbeat Op = "hb"

// Heartbeats are routed as if from this table (topic and subject
// templates need a db and a table; "__" keeps them apart from any real
// one).
const (
	HeartbeatDB    = "__cdcout"
	HeartbeatTable = "heartbeat"
)

// Heartbeat is what a heartbeat record says.
type Heartbeat struct {
	Instance, Version string
	// ServerID, File, Pos and GTIDSet are the position the source has
	// been read up to (GTIDSet: the executed set there, "" without GTIDs).
	ServerID uint32
	File     string
	Pos      uint32
	GTIDSet  string
	// SourceTime is the commit time of the last transaction read (zero
	// before the first); Time is when the heartbeat was made.
	SourceTime, Time time.Time
}

// HeartbeatKey is the row key heartbeats carry (Kafka record key): the
// instance, so one partition gets them in order.
func HeartbeatKey(instance string) (string, error) {
	b, err := Marshal(map[string]any{"instance": instance})
	return string(b), err
}

// MarshalHeartbeat returns a heartbeat's envelope as canonical JSON, in
// the change envelope's shape (op "hb", no images), with id when != "":
//
//	{"id":…,"key":{"instance":…},"op":"hb","source":{"connector","db","file",
//	 "gtid_set","instance","pos","server_id","table","ts_ms","version"},"ts_ms":…}
func MarshalHeartbeat(h Heartbeat, id string) ([]byte, error) {
	var srcMs int64
	if !h.SourceTime.IsZero() {
		srcMs = h.SourceTime.UnixMilli()
	}
	env := map[string]any{
		"key": map[string]any{"instance": h.Instance},
		"op":  string(OpHeartbeat),
		"source": map[string]any{
			"connector": "cdcout", "version": h.Version, "instance": h.Instance,
			"db": HeartbeatDB, "table": HeartbeatTable,
			"server_id": h.ServerID, "file": h.File, "pos": h.Pos, "gtid_set": h.GTIDSet,
			"ts_ms": srcMs,
		},
		"ts_ms": h.Time.UnixMilli(),
	}
	if id != "" {
		env["id"] = id
	}
	return Marshal(env)
}
