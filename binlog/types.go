// Package binlog reads a MySQL or MariaDB binary log as a stream of
// canonical row changes and transaction commits.
//
// A Stream wraps go-mysql's BinlogSyncer. It checks the server before it
// starts (binary log on, ROW format, FULL row image, replication grants, a
// usable server id), decodes every row image with the schema it was written
// under, and surfaces transaction boundaries so that later stages checkpoint
// only at a commit: a resume position inside a transaction would replay half
// of it or skip the other half.
package binlog

import (
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
)

// Position is a resume point in the binary log: the position just after a
// committed transaction.
//
// With GTIDs (MariaDB always, MySQL with gtid_mode=ON) GTIDSet is the set of
// transactions executed up to here, in the server flavor's text form
// ("0-1-42" for MariaDB, "uuid:1-42" for MySQL), and is what a resume uses:
// it survives a failover to another server of the same replication topology.
// File and Pos are kept as well; without GTIDs they are the resume point and
// ServerUUID records whose file names they are, because a file:pos means
// nothing on another server.
type Position struct {
	Flavor     string `json:"flavor"` // "mysql" or "mariadb"
	GTIDSet    string `json:"gtid_set,omitempty"`
	ServerUUID string `json:"server_uuid,omitempty"`
	File       string `json:"file,omitempty"`
	Pos        uint32 `json:"pos,omitempty"`
}

// Config configures a Stream.
type Config struct {
	// DSN is a go-sql-driver DSN (user:pass@tcp(host:3306)/?tls=…).
	DSN string
	// ServerID is the id this client presents as a replica. It must be
	// non-zero and differ from the server's and every other replica's.
	ServerID uint32
	// From is where to start when Resume is nil: "now", "start" (the oldest
	// binlog the server still has), a GTID set, or "file:pos".
	From string
	// Resume, when set, is a checkpoint to continue from; it wins over From.
	Resume *Position
	// Include lists table patterns ("db.tbl", "db.*"); empty means all.
	Include []string
	// ExcludeDBs are never captured (cdcout's own state database).
	ExcludeDBs []string
	// OwnMarkedDBs are databases holding cdcout's marker table
	// (state.MarkerTable) that this stream still decodes for its own use:
	// its backfill watermark database. Every other marked database —
	// another installation's state or watermarks — is never captured.
	OwnMarkedDBs []string
	// Instance and Version fill the envelope's source block.
	Instance string
	Version  string
	// HeartbeatPeriod asks the server for heartbeats when idle; ReadTimeout
	// (longer) declares a silent connection dead and reconnects.
	HeartbeatPeriod time.Duration
	ReadTimeout     time.Duration
	// ForceSchemaFallback reads column names from information_schema even
	// when the server writes binlog_row_metadata=FULL (tests use it).
	ForceSchemaFallback bool
	// OnTableDDL, when set, is told of every TRUNCATE or DROP TABLE of a
	// captured table (logged at warn either way); it runs on the reading
	// goroutine and must not block.
	OnTableDDL func(TableDDL)
	// DDLRecords emits a schema-change record (canonical.OpDDL, with the
	// statement and the table's column lists) for every CREATE, ALTER,
	// RENAME, DROP and TRUNCATE of a captured table, in stream order
	// before the statement's Commit (ddlrecord.go).
	DDLRecords bool
	Logger     *zap.Logger
}

// Commit is the end of one source transaction.
type Commit struct {
	// Pos is the resume position after this transaction — or, when Held,
	// the position before a prepared XA transaction (binlog/xa.go), which a
	// restart must read again.
	Pos Position
	// Held: Pos is held back; a restart from it replays this transaction.
	Held bool
	// GTID of the transaction ("" without GTIDs).
	GTID string
	// Time is the commit's event time on the source clock.
	Time time.Time
	// Rows is the number of row images the transaction carried (after
	// table filtering).
	Rows int
}

// Event is one item of the stream: a row change (or, with
// Config.DDLRecords, a schema-change record: Change.Op canonical.OpDDL) or
// a commit. Exactly one of the two fields is set. Every row change of a transaction precedes that
// transaction's Commit.
type Event struct {
	Change *canonical.Change
	Commit *Commit
}

// Info describes the server a Stream reads from.
type Info struct {
	Flavor     string // "mysql" or "mariadb"
	Version    string // server version string
	ServerUUID string // MySQL server_uuid, or MariaDB's "<server_id>" stand-in
	ServerID   uint32
	GTIDMode   bool
	// MetadataMode is "binlog" when column names come from
	// binlog_row_metadata=FULL and "information_schema" in the fallback.
	MetadataMode string
}
