package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap/zapcore"

	"github.com/cdcout/cdcout/filter"
	"github.com/cdcout/cdcout/state"
)

// namePattern limits sink and instance names: they are spliced into pipe
// names "<instance>:<db.table>:<sink>", lease names and metric labels.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// identPattern is one part of a table pattern: an identifier, possibly with
// * wildcards.
var identPattern = regexp.MustCompile(`^[^.\s]+$`)

// Validate reports every problem in c with its field path. It never quotes
// a secret: DSNs are described by user@address, secrets not at all.
func (c *Config) Validate() error {
	var errs Errors
	if c.DSN == "" {
		errs.add("dsn", "required (the source server, e.g. user:pass@tcp(host:3306)/)")
	} else {
		checkDSN(&errs, "dsn", string(c.DSN))
	}
	if c.StateDSN != "" {
		checkDSN(&errs, "state_dsn", string(c.StateDSN))
	}
	if err := state.CheckName(c.StateDB); err != nil {
		errs.add("state_db", "%v", err)
	}
	if !namePattern.MatchString(c.Instance) {
		errs.add("instance", "%q: use 1-64 letters, digits, '_', '.', '-'", c.Instance)
	}
	if strings.TrimSpace(c.ReplicaID) == "" || len(c.ReplicaID) > 128 || strings.ContainsAny(c.ReplicaID, "/ \t\n") {
		errs.add("replica_id", "%q: use 1-128 characters without '/' or spaces", c.ReplicaID)
	}
	for i, p := range c.Tables {
		if err := checkTablePattern(p); err != nil {
			errs.add(fmt.Sprintf("tables[%d]", i), "%v", err)
		} else if !WholeNamePattern(p) {
			errs.add(fmt.Sprintf("tables[%d]", i), "%q: * must stand for a whole name here (db.table, db.*, *.table); sinks' tables: filters take partial patterns", p)
		}
	}
	if err := checkFrom(c.From); err != nil {
		errs.add("from", "%v", err)
	}
	switch c.ChangeIdentity {
	case "auto", "gtid", "digest":
	default:
		errs.add("change_identity", "%q is not auto, gtid or digest", c.ChangeIdentity)
	}
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs.add("log_level", "%q is not debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "", "json", "console":
	default:
		errs.add("log_format", "%q is not json or console", c.LogFormat)
	}
	if c.RetentionHours <= 0 {
		errs.add("retention_hours", "must be at least 1, got %d", c.RetentionHours)
	}
	if c.LeaseTTL < time.Second {
		errs.add("lease_ttl", "must be at least 1s, got %s", c.LeaseTTL)
	}
	if c.DedupWindow < 0 {
		errs.add("dedup_window", "must not be negative, got %s", c.DedupWindow)
	} else if c.DedupWindow > 0 && c.DedupWindow <= c.LeaseTTL {
		errs.add("dedup_window", "%s must exceed lease_ttl %s: claims must outlive a lease takeover", c.DedupWindow, c.LeaseTTL)
	}
	if c.ClaimLease <= 0 {
		errs.add("claim_lease", "must be positive, got %s", c.ClaimLease)
	}
	if c.HTTPAddr != "off" {
		checkListenAddr(&errs, "http_addr", c.HTTPAddr)
	}
	if c.HTTPKeepAlive <= 0 {
		errs.add("http_keep_alive", "must be positive, got %s", c.HTTPKeepAlive)
	} else if c.HTTPHeadersTimeout != 0 && c.HTTPHeadersTimeout <= c.HTTPKeepAlive {
		errs.add("http_headers_timeout", "%s must exceed http_keep_alive %s: a shorter headers deadline cuts off requests on idle keep-alive connections", c.HTTPHeadersTimeout, c.HTTPKeepAlive)
	}
	if c.BackfillChunkSize < 1 || c.BackfillChunkSize > 100_000 {
		errs.add("backfill_chunk_size", "must be between 1 and 100000, got %d", c.BackfillChunkSize)
	}
	if c.BinlogRunwayMin < 0 {
		errs.add("binlog_runway_min", "must not be negative, got %s (0 disables the check)", c.BinlogRunwayMin)
	}
	if c.HandoffBufferSize <= 0 {
		errs.add("handoff_buffer_size", "must be positive, got %d", c.HandoffBufferSize)
	}
	if c.EnqueueBatchSize <= 0 {
		errs.add("enqueue_batch_size", "must be positive, got %d", c.EnqueueBatchSize)
	}
	if c.EnqueueFlushInterval <= 0 {
		errs.add("enqueue_flush_interval", "must be positive, got %s", c.EnqueueFlushInterval)
	}
	if c.EnqueueMaxBuffer < c.EnqueueBatchSize {
		errs.add("enqueue_max_buffer", "%d must be at least enqueue_batch_size %d", c.EnqueueMaxBuffer, c.EnqueueBatchSize)
	}
	switch c.SegmentFormat {
	case SegmentFormatAuto, "1", "2":
	default:
		errs.add("segment_format", "%q is not auto, 1 or 2", c.SegmentFormat)
	}
	if c.MaxRowBytes < 0 {
		errs.add("max_row_bytes", "must be 0 (no ceiling) or a positive byte count, got %d", c.MaxRowBytes)
	}
	if c.ShutdownTimeout <= 0 {
		errs.add("shutdown_timeout", "must be positive, got %s", c.ShutdownTimeout)
	}

	c.validateAdmin(&errs)

	if len(c.Sinks) == 0 {
		errs.add("sinks", "no sinks configured (add --sink stdout: or a sinks: list in the config file)")
	}
	seen := map[string]int{}
	for i := range c.Sinks {
		c.Sinks[i].validate(&errs, fmt.Sprintf("sinks[%d]", i), c.ClaimLease)
		if n := c.Sinks[i].Name; n != "" {
			if j, dup := seen[n]; dup {
				errs.add(fmt.Sprintf("sinks[%d].name", i), "duplicate sink name %q (also sinks[%d])", n, j)
			} else {
				seen[n] = i
			}
		}
	}
	return errs.err()
}

// checkListenAddr reports addr unless it is host:port with a numeric port.
func checkListenAddr(errs *Errors, field, addr string) {
	if _, port, err := net.SplitHostPort(addr); err != nil {
		errs.add(field, "%q is not host:port or off", addr)
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		errs.add(field, "%q: bad port", addr)
	}
}

func checkDSN(errs *Errors, field, dsn string) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		// go-sql-driver's parse errors are fixed strings; none quotes the DSN.
		errs.add(field, "invalid DSN (want user:pass@tcp(host:3306)/): %v", err)
		return
	}
	if cfg.Net != "tcp" && cfg.Net != "unix" {
		errs.add(field, "network %q: use tcp(host:port) or unix(/path)", cfg.Net)
	}
}

// validateURL checks the sink's URL for its scheme.
func (s *Sink) validateURL(errs *Errors, at, scheme string) {
	switch scheme {
	case "stdout":
	case "file":
		u, err := neturl.Parse(s.URL)
		if err != nil || u.Path == "" || !path.IsAbs(u.Path) || (u.Host != "" && u.Host != "localhost") {
			errs.add(at+".url", "want file:///absolute/path.jsonl")
		}
	case "http", "https":
		u, err := neturl.Parse(s.URL)
		if err != nil || u.Host == "" {
			errs.add(at+".url", "want %s://host[:port]/path", scheme)
		}
	case "kafka", "nats":
		// Broker lists ("b1:9092,b2:9092") and {db}/{table} templates are
		// not URLs net/url accepts; the sink packages parse them.
		rest := s.URL[len(scheme)+1:]
		hosts, _, _ := strings.Cut(strings.TrimPrefix(rest, "//"), "/")
		if !strings.HasPrefix(rest, "//") || strings.Trim(hosts, ", ") == "" {
			errs.add(at+".url", "want %s://host:port[,host:port]/template", scheme)
		}
	case "redis", "rediss":
		// The stream template is not a Redis database number, so the URL
		// is not one go-redis parses; sink/redissink does.
		rest, ok := strings.CutPrefix(s.URL[len(scheme)+1:], "//")
		hostPart, _, _ := strings.Cut(rest, "/")
		hostPart, _, _ = strings.Cut(hostPart, "?")
		if i := strings.LastIndexByte(hostPart, '@'); i >= 0 {
			hostPart = hostPart[i+1:]
		}
		if !ok || hostPart == "" {
			errs.add(at+".url", "want %s://[user:password@]host:port/stream-template", scheme)
		}
	case "pubsub":
		if project, _, _ := strings.Cut(strings.TrimPrefix(s.URL, "pubsub://"), "/"); !strings.HasPrefix(s.URL, "pubsub://") || project == "" {
			errs.add(at+".url", "want pubsub://project/topic-template")
		}
	case "":
		if s.URL == "" {
			errs.add(at+".url", "required (stdout:, file://, http://, https://, kafka://, nats://, redis://, pubsub://)")
		} else {
			errs.add(at+".url", "no scheme (want stdout:, file://, http://, https://, kafka://, nats://, redis://, pubsub://)")
		}
	default:
		errs.add(at+".url", "unknown scheme %q (want stdout:, file://, http://, https://, kafka://, nats://, redis://, pubsub://)", scheme)
	}
}

// validateOptions checks the scheme-specific option blocks (kafka:, http:,
// nats:).
func (s *Sink) validateOptions(errs *Errors, at, scheme string) {
	if s.Kafka != nil {
		if scheme != "kafka" {
			errs.add(at+".kafka", "only for kafka:// sinks")
		}
		if s.Kafka.SASL != nil {
			switch s.Kafka.SASL.Mechanism {
			case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
			default:
				errs.add(at+".kafka.sasl.mechanism", "%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Kafka.SASL.Mechanism)
			}
			if s.Kafka.SASL.Username == "" {
				errs.add(at+".kafka.sasl.username", "required with sasl")
			}
		}
		checkTLS(errs, at+".kafka.tls", s.Kafka.TLS)
	}
	if s.HTTP != nil && scheme != "http" && scheme != "https" {
		errs.add(at+".http", "only for http(s):// sinks")
	}
	if s.HTTP != nil && s.HTTP.MaxConcurrency < 0 {
		errs.add(at+".http.max_concurrency", "must not be negative, got %d (0 means the default, 64)", s.HTTP.MaxConcurrency)
	}
	if s.NATS != nil {
		if scheme != "nats" {
			errs.add(at+".nats", "only for nats:// sinks")
		}
		n := s.NATS
		methods := 0
		for _, set := range []bool{n.CredentialsFile != "", n.User != "" || n.Password != "", n.Token != ""} {
			if set {
				methods++
			}
		}
		if methods > 1 {
			errs.add(at+".nats", "use one of credentials_file, user/password, token")
		}
		if (n.User == "") != (n.Password == "") {
			errs.add(at+".nats", "user and password go together")
		}
		checkTLS(errs, at+".nats.tls", n.TLS)
	}
}

// validate checks one sink at field path at (sinks[i]).
func (s *Sink) validate(errs *Errors, at string, claimLease time.Duration) {
	if s.Name == "" {
		errs.add(at+".name", "required")
	} else if !namePattern.MatchString(s.Name) {
		errs.add(at+".name", "%q: use 1-64 letters, digits, '_', '.', '-'", s.Name)
	}
	scheme := schemeOf(s.URL)
	s.validateURL(errs, at, scheme)
	switch s.Format {
	case "debezium", "cloudevents", "maxwell", "native":
	default:
		errs.add(at+".format", "%q is not debezium, cloudevents, maxwell or native", s.Format)
	}
	for i, p := range s.Tables.Include {
		if err := checkTablePattern(p); err != nil {
			errs.add(fmt.Sprintf("%s.tables.include[%d]", at, i), "%v", err)
		}
	}
	for i, p := range s.Tables.Exclude {
		if err := checkTablePattern(p); err != nil {
			errs.add(fmt.Sprintf("%s.tables.exclude[%d]", at, i), "%v", err)
		}
	}
	for i, op := range s.Ops {
		if _, ok := OpNames[op]; !ok {
			errs.add(fmt.Sprintf("%s.ops[%d]", at, i), "%q is not insert, update or delete", op)
		}
	}
	checkColumns(errs, at+".drop_columns", s.DropColumns)
	s.validateTransforms(errs, at)
	s.validateKey(errs, at, scheme)
	if s.Filter != "" {
		if _, err := filter.Compile(s.Filter); err != nil {
			errs.add(at+".filter", "%v", err)
		}
	}
	if s.Secret != "" && scheme != "http" && scheme != "https" {
		errs.add(at+".secret", "only http(s) sinks sign requests")
	} else if _, err := WebhookKey(s.Secret.Value()); err != nil {
		errs.add(at+".secret", "%v", err)
	}
	if len(s.Headers) > 0 && scheme != "http" && scheme != "https" {
		errs.add(at+".headers", "only http(s) sinks send headers")
	}
	for k := range s.Headers {
		if k == "" || strings.ContainsAny(k, " \t\r\n:") {
			errs.add(at+".headers", "%q is not a valid header name", k)
		}
	}
	if s.Timeout <= 0 {
		errs.add(at+".timeout", "must be positive, got %s", s.Timeout)
	}
	if s.Timeout > 0 && claimLease > 0 && claimLease <= s.Timeout {
		errs.add(at+".timeout", "%s must be shorter than claim_lease %s, or a slow delivery would be handed to a second drainer", s.Timeout, claimLease)
	}
	if s.Heartbeat < 0 || (s.Heartbeat > 0 && s.Heartbeat < 100*time.Millisecond) {
		errs.add(at+".heartbeat", "must be 0 (off) or at least 100ms, got %s", s.Heartbeat)
	}
	switch s.Snapshot {
	case "", SnapshotNever, SnapshotInitial:
	default:
		errs.add(at+".snapshot", "must be %s or %s, got %q", SnapshotInitial, SnapshotNever, s.Snapshot)
	}
	if s.MaxAttempts < 0 {
		errs.add(at+".max_attempts", "must not be negative, got %d", s.MaxAttempts)
	}
	if s.BatchSize < 0 {
		errs.add(at+".batch_size", "must not be negative, got %d", s.BatchSize)
	}
	if s.Concurrency < 0 {
		errs.add(at+".concurrency", "must not be negative, got %d", s.Concurrency)
	}
	s.validateOptions(errs, at, scheme)
}

func checkTLS(errs *Errors, at string, t *TLS) {
	if t == nil {
		return
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		errs.add(at, "cert_file and key_file go together")
	}
}

func slicesHasEmpty(parts []string) bool {
	for _, p := range parts {
		if p == "" {
			return true
		}
	}
	return false
}

// OpNames maps the ops: names to their canonical ops' letters.
var OpNames = map[string]string{"insert": "c", "update": "u", "delete": "d"}

// checkTablePattern accepts "db.table" where either part may hold *
// wildcards ("db.*", "*.users", "shop.order_*").
func checkTablePattern(p string) error {
	parts := strings.Split(p, ".")
	if len(parts) != 2 || !identPattern.MatchString(parts[0]) || !identPattern.MatchString(parts[1]) {
		return fmt.Errorf("%q: want db.table (either part may use *, e.g. shop.*)", p)
	}
	for _, part := range parts {
		if _, err := path.Match(part, ""); err != nil {
			return fmt.Errorf("%q: bad pattern", p)
		}
	}
	return nil
}

// WholeNamePattern reports whether p uses * only as a whole name ("db.*",
// "*.tbl"), the form the binlog reader's capture filter takes.
func WholeNamePattern(p string) bool {
	for _, part := range strings.Split(p, ".") {
		if part != "*" && strings.Contains(part, "*") {
			return false
		}
	}
	return true
}

// MatchTable reports whether a db.table pattern matches db and table.
func MatchTable(pattern, db, table string) bool {
	i := strings.IndexByte(pattern, '.')
	if i < 0 {
		return false
	}
	okDB, _ := path.Match(pattern[:i], db)
	okTbl, _ := path.Match(pattern[i+1:], table)
	return okDB && okTbl
}

// The values of a sink's snapshot key.
const (
	SnapshotInitial = "initial"
	SnapshotNever   = "never"
)

// Matches reports whether the filter selects db.table.
func (f TableFilter) Matches(db, table string) bool {
	for _, p := range f.Exclude {
		if MatchTable(p, db, table) {
			return false
		}
	}
	if len(f.Include) == 0 {
		return true
	}
	for _, p := range f.Include {
		if MatchTable(p, db, table) {
			return true
		}
	}
	return false
}

var (
	gtidMariaDB = regexp.MustCompile(`^\d+-\d+-\d+$`)
	gtidMySQL   = regexp.MustCompile(`^[0-9a-fA-F-]{36}(:\d+(-\d+)?)+$`)
)

// checkFrom accepts now, start, a GTID set (MariaDB "0-1-42,1-2-7" or
// MySQL "uuid:1-42,…") or file:pos.
func checkFrom(from string) error {
	switch from {
	case "now", "start":
		return nil
	case "":
		return fmt.Errorf("required: now, start, a GTID set or file:pos")
	}
	if i := strings.LastIndexByte(from, ':'); i > 0 && !strings.Contains(from, ",") {
		if _, err := strconv.ParseUint(from[i+1:], 10, 32); err == nil && !gtidMySQL.MatchString(from) {
			return nil // file:pos
		}
	}
	for _, g := range strings.Split(from, ",") {
		g = strings.TrimSpace(g)
		if !gtidMariaDB.MatchString(g) && !gtidMySQL.MatchString(g) {
			return fmt.Errorf("%q is not now, start, a GTID set or file:pos", from)
		}
	}
	return nil
}

// WebhookKey turns a configured webhook secret into key bytes:
// "whsec_<base64>" is decoded as the Standard Webhooks spec defines;
// anything else is used as it is. Validate checks it, so that a bad secret
// is reported with every other problem, not after they are fixed.
func WebhookKey(s string) ([]byte, error) {
	if rest, ok := strings.CutPrefix(s, "whsec_"); ok {
		key, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, errors.New("secret starts with whsec_ but the rest is not base64")
		}
		return key, nil
	}
	return []byte(s), nil
}
