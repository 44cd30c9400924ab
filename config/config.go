// Package config holds cdcout run's configuration: what it reads (the
// source DSN, tables), where it keeps state, which sinks it feeds, and the
// timings of leases, claims and retention.
//
// A Config is built from four layers, later ones winning: defaults, the YAML
// file (--config), CDCOUT_<FLAG> environment variables, and command-line
// flags (Resolve). Validate then reports every problem at once, each with
// its field path ("sinks[1].url: …"), so an operator fixes a file in one
// round instead of one error per restart. Secrets (DSN passwords, webhook
// secrets, broker passwords) are typed so they never print.
package config

import (
	"os"
	"time"
)

// Config is the configuration of one `cdcout run` replica.
type Config struct {
	// DSN is the source server (go-sql-driver form).
	DSN DSN `yaml:"dsn"`
	// StateDSN is the server holding cdcout's state database; "" means DSN.
	StateDSN DSN `yaml:"state_dsn"`
	// StateDB is the state database's name; it is created and migrated on
	// start and never captured.
	StateDB string `yaml:"state_db"`
	// File is the YAML file this configuration was read from ("" if none).
	File string `yaml:"-"`

	Sinks []Sink `yaml:"sinks"`
	// Tables limits capture to these patterns ("db.tbl", "db.*"); empty
	// means every table a sink subscribes to.
	Tables []string `yaml:"tables"`

	// Instance namespaces pipes, leases and checkpoints: two sources feeding
	// one state database need two instance names.
	Instance string `yaml:"instance"`
	// ReplicaID names this process in lease holders and claims.
	ReplicaID string `yaml:"replica_id"`
	// ServerID is the replication client id; 0 derives one from the
	// replica id and instance.
	ServerID uint32 `yaml:"server_id"`
	// From applies only when no checkpoint exists: now, start, a GTID set or
	// file:pos.
	From string `yaml:"from"`
	// ResetPosition discards the checkpoint and starts at From.
	ResetPosition bool `yaml:"reset_position"`
	// ChangeIdentity is auto, gtid or digest (docs/ARCHITECTURE.md, "Change identity").
	ChangeIdentity string `yaml:"change_identity"`

	LogLevel  string `yaml:"log_level"`
	LogFormat string `yaml:"log_format"`

	// RetentionHours keeps delivered and dead outbox rows this long.
	RetentionHours int `yaml:"retention_hours"`
	// LeaseTTL is the enqueue lease's lifetime; a crashed holder's lease is
	// taken over after it.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// DedupWindow is how long claims are kept; 0 means max(60s, 4×LeaseTTL).
	DedupWindow time.Duration `yaml:"dedup_window"`
	// ClaimLease is how long a drainer owns a row it is delivering; it must
	// exceed every sink's timeout or a slow delivery would be handed out twice.
	ClaimLease time.Duration `yaml:"claim_lease"`
	// HTTPAddr serves health and inspect endpoints; "off" disables them.
	HTTPAddr string `yaml:"http_addr"`
	// HTTPKeepAlive is the inspect server's idle keep-alive timeout: 72s by
	// default, above the 60s idle timeout of AWS ALB and Envoy and below
	// nginx's 75s (raise it above your proxy's). HTTPHeadersTimeout bounds
	// reading a request's headers; it must exceed the keep-alive
	// (default keep-alive + 5s).
	HTTPKeepAlive      time.Duration `yaml:"http_keep_alive"`
	HTTPHeadersTimeout time.Duration `yaml:"http_headers_timeout"`
	// BinlogRunwayMin: /readyz reports not ready while the source may purge
	// the binlog file holding the checkpoint sooner than this; 0 disables.
	BinlogRunwayMin time.Duration `yaml:"binlog_runway_min"`
	// BackfillChunkSize is the rows per chunk of the fleet's backfills
	// (snapshot: initial, signals and POST /v1/backfills without a chunk
	// size of their own).
	BackfillChunkSize int `yaml:"backfill_chunk_size"`
	// HandoffBufferSize bounds changes a standby replica keeps in memory.
	HandoffBufferSize int `yaml:"handoff_buffer_size"`

	// EnqueueBatchSize flushes a batch at the next commit once it holds this
	// many outbox rows; EnqueueFlushInterval once its oldest row is this old.
	EnqueueBatchSize     int           `yaml:"enqueue_batch_size"`
	EnqueueFlushInterval time.Duration `yaml:"enqueue_flush_interval"`
	// EnqueueMaxBuffer is the ceiling at which rows are written mid
	// transaction (without a checkpoint), so one huge transaction costs
	// bounded memory. In GTID mode the write waits for the end of the
	// current claim block (dedup.GTIDBlock, 100 changes), so the buffer
	// may pass it by up to 100 rows per sink.
	EnqueueMaxBuffer int `yaml:"enqueue_max_buffer"`
	// EnqueuePipeline reads, keys and encodes the next batch while one
	// enqueue transaction is in flight (engine/enqueuewrite.go). On by
	// default since the next batch's segments are encoded outside the
	// transaction (outbox.Store.PrepareBatch): backlogs drained faster
	// with it in every interleaved pair but one (docs/ARCHITECTURE.md);
	// off holds one batch less in memory.
	EnqueuePipeline bool `yaml:"enqueue_pipeline"`
	// SegmentFormat is the form enqueues write segments in: "1", which
	// every release reads; "2", which leaves out each record's key hash
	// (the reader computes it from the row key), about a quarter less
	// payload for the database to parse and log; or "auto" (the default):
	// 2 while every replica of the instance's fleet says it reads it, else
	// 1 (engine/segformat.go). A replica of a release before format 2
	// halts the pipe at the first such segment (nothing is lost or
	// skipped, but nothing moves until it is upgraded), so set "2" only
	// once every replica runs a release that reads it.
	SegmentFormat string `yaml:"segment_format"`
	// MaxRowBytes, when positive, is the ceiling on a change's row images
	// (the value bytes of before and after): a change above it is not
	// written as a record but dead-lettered with the reason, its images
	// dropped, so one huge value cannot cost the enqueue, the state
	// database and every sink its size several times over.
	MaxRowBytes int `yaml:"max_row_bytes"`
	// ShutdownTimeout bounds how long a graceful stop waits for in-flight
	// deliveries.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`

	// Admin API (admin.go): write endpoints exist only with a token.
	AdminToken     Secret `yaml:"admin_token"`
	AdminTokenFile string `yaml:"admin_token_file"`
	AdminAddr      string `yaml:"admin_addr"`
	AdminReadAuth  bool   `yaml:"admin_read_auth"`
	adminFileToken Secret
}

// Sink is one destination.
type Sink struct {
	// Name is unique and part of every pipe name; it defaults to the URL
	// scheme.
	Name string `yaml:"name"`
	// URL selects the sink type by scheme: stdout:, file:///path,
	// http(s)://…, kafka://…, nats://…, redis(s)://…, pubsub://….
	URL string `yaml:"url"`
	// Format of the payload: debezium (default), cloudevents, maxwell or
	// native (the stored envelope as is; format.Native).
	Format string      `yaml:"format"`
	Tables TableFilter `yaml:"tables"`
	// Ops limits the change kinds: insert, update, delete. Empty means all.
	Ops []string `yaml:"ops"`
	// DropColumns are removed from row images before anything is stored:
	// "col" in every table, or "db.table.col".
	DropColumns []string `yaml:"drop_columns"`
	// Column transforms (transform.go), same column syntax as
	// DropColumns.
	HashColumns    []string `yaml:"hash_columns"`
	MaskColumns    []string `yaml:"mask_columns"`
	IncludeColumns []string `yaml:"include_columns"`
	HashKey        Secret   `yaml:"hash_key"`
	HashKeyFile    string   `yaml:"hash_key_file"`
	hashFileKey    Secret
	// Key lists the columns whose values make the message key of the
	// sink's row records (Kafka record key and partition, Pub/Sub ordering
	// key, the Redis field "key", {key} in name templates), in this order;
	// empty means the row key. Per-key delivery order is the row key's
	// (README, "Message keys and name templates").
	Key []string `yaml:"key"`
	// Filter is a CEL expression over op, before, after and source; the
	// sink gets only the changes it is true for (package filter).
	Filter string `yaml:"filter"`
	// Secret signs webhooks (Standard Webhooks); "whsec_<base64>" is
	// decoded, anything else is used as raw bytes.
	Secret  Secret            `yaml:"secret"`
	Headers map[string]Secret `yaml:"headers"`
	// Timeout bounds one delivery attempt.
	Timeout     time.Duration `yaml:"timeout"`
	MaxAttempts int           `yaml:"max_attempts"`
	BatchSize   int           `yaml:"batch_size"`
	Concurrency int           `yaml:"concurrency"`
	// Heartbeat, when positive, sends the sink an "hb" record with the
	// source position whenever it got no record for this long.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// Transactions adds BEGIN/END records around each source transaction
	// that touched the sink's tables, and source.tx to its changes.
	Transactions bool `yaml:"transactions"`
	// Snapshot is "initial" (backfill the sink's tables the first time it
	// has them, consistent with the stream) or "never" (the default: only
	// changes from the stream).
	Snapshot string `yaml:"snapshot"`
	// DDL sends the sink a schema-change record ("ddl") for every CREATE,
	// ALTER, RENAME, DROP and TRUNCATE of a table it captures, in order
	// with the table's rows.
	DDL bool `yaml:"ddl"`

	Kafka *KafkaOptions `yaml:"kafka"`
	NATS  *NATSOptions  `yaml:"nats"`
	HTTP  *HTTPOptions  `yaml:"http"`
}

// HTTPOptions are the http: block of a webhook sink.
type HTTPOptions struct {
	// Batch sends each delivery call's records (up to batch_size) in one
	// POST whose body is a JSON array of the records' bodies, instead of
	// one POST per record.
	Batch bool `yaml:"batch"`
	// MaxConcurrency caps the endpoint's adaptive concurrency limit:
	// requests in flight to it, from all the sink's pipes, and
	// connections to its host. 0 means sink.DefaultMaxLimit (64).
	MaxConcurrency int `yaml:"max_concurrency"`
}

// TableFilter selects tables by pattern ("db.tbl", "db.*", "*.tbl").
// Empty Include means every table; Exclude wins over Include.
type TableFilter struct {
	Include []string `yaml:"include"`
	Exclude []string `yaml:"exclude"`
}

// TLS configures a client's TLS.
type TLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// SASL configures Kafka authentication.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	Password  Secret `yaml:"password"`
}

// KafkaOptions are the kafka: block of a kafka:// sink.
type KafkaOptions struct {
	TLS  *TLS  `yaml:"tls"`
	SASL *SASL `yaml:"sasl"`
}

// NATSOptions are the nats: block of a nats:// sink.
type NATSOptions struct {
	TLS             *TLS   `yaml:"tls"`
	CredentialsFile string `yaml:"credentials_file"`
	User            string `yaml:"user"`
	Password        Secret `yaml:"password"`
	Token           Secret `yaml:"token"`
}

// SegmentFormatAuto is segment_format's default: format 2 while every
// replica of the fleet reads it, else format 1.
const SegmentFormatAuto = "auto"

// Sink defaults.
const (
	DefaultSinkTimeout     = 10 * time.Second
	DefaultSinkMaxAttempts = 25
	DefaultSinkBatchSize   = 100
	DefaultSinkConcurrency = 8
)

// Default returns a Config with every default filled in.
func Default() *Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "cdcout"
	}
	return &Config{
		StateDB:              "cdcout",
		Instance:             "default",
		ReplicaID:            host,
		From:                 "now",
		ChangeIdentity:       "auto",
		LogLevel:             "info",
		RetentionHours:       72,
		LeaseTTL:             15 * time.Second,
		ClaimLease:           5 * time.Minute,
		HTTPAddr:             "127.0.0.1:8080",
		HTTPKeepAlive:        72 * time.Second,
		HandoffBufferSize:    10000,
		EnqueueBatchSize:     1000,
		BackfillChunkSize:    1000,
		EnqueueFlushInterval: 20 * time.Millisecond,
		EnqueueMaxBuffer:     5000,
		EnqueuePipeline:      true,
		SegmentFormat:        SegmentFormatAuto,
		ShutdownTimeout:      30 * time.Second,
	}
}

// EffectiveStateDSN is StateDSN, or DSN when unset.
func (c *Config) EffectiveStateDSN() DSN {
	if c.StateDSN != "" {
		return c.StateDSN
	}
	return c.DSN
}

// EffectiveDedupWindow is DedupWindow, or max(60s, 4×LeaseTTL) when unset:
// a claim must outlive a lease takeover (TTL plus a heartbeat) or a new
// leader could re-enqueue what the old one already wrote.
func (c *Config) EffectiveDedupWindow() time.Duration {
	if c.DedupWindow > 0 {
		return c.DedupWindow
	}
	return max(60*time.Second, 4*c.LeaseTTL)
}

// FillSinkDefaults sets the per-sink defaults (name from the scheme,
// format, timeout, attempts, batch size, concurrency). Resolve calls it; a
// Config built by hand (tests, tools) calls it before Validate.
func (c *Config) FillSinkDefaults() {
	for i := range c.Sinks {
		s := &c.Sinks[i]
		if s.Name == "" {
			s.Name = schemeOf(s.URL)
		}
		if s.Format == "" {
			s.Format = "debezium"
		}
		if s.Timeout == 0 {
			s.Timeout = DefaultSinkTimeout
		}
		if s.MaxAttempts == 0 {
			s.MaxAttempts = DefaultSinkMaxAttempts
		}
		if s.BatchSize == 0 {
			s.BatchSize = DefaultSinkBatchSize
		}
		if s.Concurrency == 0 {
			s.Concurrency = DefaultSinkConcurrency
		}
	}
}
