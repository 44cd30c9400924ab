package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodDSN = "cdc:s3cretpw@tcp(127.0.0.1:3306)/"

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cdcout.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaults(t *testing.T) {
	cfg, err := Resolve(Sources{Flags: []Setting{{"dsn", goodDSN}, {"sink", "stdout:"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	checks := []struct {
		name      string
		got, want any
	}{
		{"state_db", cfg.StateDB, "cdcout"},
		{"instance", cfg.Instance, "default"},
		{"replica_id", cfg.ReplicaID, host},
		{"from", cfg.From, "now"},
		{"change_identity", cfg.ChangeIdentity, "auto"},
		{"retention_hours", cfg.RetentionHours, 72},
		{"lease_ttl", cfg.LeaseTTL, 15 * time.Second},
		{"dedup_window", cfg.EffectiveDedupWindow(), 60 * time.Second},
		{"claim_lease", cfg.ClaimLease, 5 * time.Minute},
		{"http_addr", cfg.HTTPAddr, "127.0.0.1:8080"},
		{"handoff_buffer_size", cfg.HandoffBufferSize, 10000},
		{"enqueue_pipeline", cfg.EnqueuePipeline, true},
		{"segment_format", cfg.SegmentFormat, "auto"},
		{"state dsn", cfg.EffectiveStateDSN(), DSN(goodDSN)},
		{"sink name", cfg.Sinks[0].Name, "stdout"},
		{"sink format", cfg.Sinks[0].Format, "debezium"},
		{"sink timeout", cfg.Sinks[0].Timeout, DefaultSinkTimeout},
		{"sink concurrency", cfg.Sinks[0].Concurrency, 8},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	cfg.LeaseTTL = 30 * time.Second
	if got, want := cfg.EffectiveDedupWindow(), 120*time.Second; got != want {
		t.Errorf("dedup window with 30s ttl = %s, want %s", got, want)
	}
}

// TestEnqueuePipelineOff: the pipeline is on by default, and each source
// turns it off.
func TestEnqueuePipelineOff(t *testing.T) {
	env := func(k string) (string, bool) {
		if k == EnvName("enqueue-pipeline") {
			return "false", true
		}
		return "", false
	}
	cfg := Default()
	if err := parseYAML(cfg, []byte("enqueue_pipeline: false\n")); err != nil {
		t.Fatal(err)
	}
	if cfg.EnqueuePipeline {
		t.Error("enqueue_pipeline: false in the file left the pipeline on")
	}
	for name, src := range map[string]Sources{
		"flag":        {Flags: []Setting{{"dsn", goodDSN}, {"sink", "stdout:"}, {"enqueue-pipeline", "false"}}},
		"environment": {Flags: []Setting{{"dsn", goodDSN}, {"sink", "stdout:"}}, Env: env},
	} {
		cfg, err := Resolve(src)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.EnqueuePipeline {
			t.Errorf("enqueue-pipeline false from the %s left the pipeline on", name)
		}
	}
}

// TestSegmentFormatValues: the file takes a number as well as "auto" (a
// file written when the setting was a number keeps working), and the flag
// and its environment variable the same words.
func TestSegmentFormatValues(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{{"1", "1"}, {"2", "2"}, {"auto", "auto"}, {`"2"`, "2"}} {
		cfg := Default()
		if err := parseYAML(cfg, []byte("segment_format: "+c.yaml+"\n")); err != nil {
			t.Fatalf("segment_format: %s: %v", c.yaml, err)
		}
		if cfg.SegmentFormat != c.want {
			t.Errorf("segment_format: %s read as %q, want %q", c.yaml, cfg.SegmentFormat, c.want)
		}
	}
	cfg, err := Resolve(Sources{Flags: []Setting{{"dsn", goodDSN}, {"sink", "stdout:"}, {"segment-format", "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SegmentFormat != "1" {
		t.Errorf("--segment-format 1 resolved to %q", cfg.SegmentFormat)
	}
	cfg, err = Resolve(Sources{Flags: []Setting{{"dsn", goodDSN}, {"sink", "stdout:"}, {"segment-format", "two"}}})
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), `segment_format: "two" is not auto, 1 or 2`) {
		t.Errorf("--segment-format two: got %v", err)
	}
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, `
dsn: "file:pw@tcp(file:3306)/"
instance: fromfile
lease_ttl: 20s
retention_hours: 10
replica_id: filereplica
sinks:
  - name: hook
    url: http://file.example/hook
    secret: whsec_abc
    timeout: 3s
`)
	env := envOf(map[string]string{
		"CDCOUT_CONFIG":          file,
		"CDCOUT_INSTANCE":        "fromenv",
		"CDCOUT_LEASE_TTL":       "25s",
		"CDCOUT_RETENTION_HOURS": "5",
		"CDCOUT_SINK":            "hook=http://env.example/hook",
	})
	cfg, err := Resolve(Sources{Env: env, Flags: []Setting{{"instance", "fromflag"}, {"sink", "out=file:///tmp/x.jsonl"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Instance, "fromflag"; got != want {
		t.Errorf("instance = %q, want %q (flag beats env beats file)", got, want)
	}
	if got, want := cfg.LeaseTTL, 25*time.Second; got != want {
		t.Errorf("lease_ttl = %s, want %s (env beats file)", got, want)
	}
	if got, want := cfg.RetentionHours, 5; got != want {
		t.Errorf("retention_hours = %d, want %d", got, want)
	}
	if got, want := cfg.ReplicaID, "filereplica"; got != want {
		t.Errorf("replica_id = %q, want %q (file beats default)", got, want)
	}
	// --sink given: CDCOUT_SINK is ignored, and the flag's sink is added
	// beside the file's.
	if got, want := len(cfg.Sinks), 2; got != want {
		t.Fatalf("sinks = %+v, want %d", cfg.Sinks, want)
	}
	if got, want := cfg.Sinks[0].URL, "http://file.example/hook"; got != want {
		t.Errorf("sinks[0].url = %q, want %q", got, want)
	}
	if got, want := cfg.Sinks[1].Name, "out"; got != want {
		t.Errorf("sinks[1].name = %q, want %q", got, want)
	}

	// Without --sink, CDCOUT_SINK overrides the file sink's URL by name and
	// keeps its options.
	cfg, err = Resolve(Sources{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(cfg.Sinks), 1; got != want {
		t.Fatalf("sinks = %+v, want %d", cfg.Sinks, want)
	}
	if got, want := cfg.Sinks[0].URL, "http://env.example/hook"; got != want {
		t.Errorf("url = %q, want %q", got, want)
	}
	if got, want := cfg.Sinks[0].Timeout, 3*time.Second; got != want {
		t.Errorf("timeout = %s, want %s (kept from file)", got, want)
	}
	if got, want := cfg.Sinks[0].Secret.Value(), "whsec_abc"; got != want {
		t.Errorf("secret = %q, want %q", got, want)
	}
}

func TestEveryFlagHasEnv(t *testing.T) {
	for _, name := range SettingNames() {
		if name == "config" || name == "sink" {
			continue
		}
		// A value that parses for every kind of setting is impossible, so
		// check that the variable is read at all: a wrong value must
		// produce an error naming the variable, or a valid string must land.
		_, err := Resolve(Sources{Env: envOf(map[string]string{EnvName(name): "not-a-number"})})
		cfgS, _ := Resolve(Sources{})
		cfgE, _ := Resolve(Sources{Env: envOf(map[string]string{EnvName(name): "not-a-number"})})
		if err == nil && fmt.Sprintf("%+v", cfgS) == fmt.Sprintf("%+v", cfgE) {
			t.Errorf("%s had no effect", EnvName(name))
		}
		if err != nil && !strings.Contains(err.Error(), EnvName(name)) {
			t.Errorf("%s error %q does not name the variable", EnvName(name), err)
		}
	}
	if got, want := EnvName("retention-hours"), "CDCOUT_RETENTION_HOURS"; got != want {
		t.Errorf("EnvName = %q, want %q", got, want)
	}
}

func TestParseSinkArg(t *testing.T) {
	for _, tc := range []struct{ in, name, url string }{
		{"stdout:", "stdout", "stdout:"},
		{"file:///tmp/a.jsonl", "file", "file:///tmp/a.jsonl"},
		{"hook=https://x.example/a?b=c", "hook", "https://x.example/a?b=c"},
		{"https://x.example/a?b=c", "https", "https://x.example/a?b=c"},
		{"k=kafka://b1:9092,b2:9092/topic", "k", "kafka://b1:9092,b2:9092/topic"},
	} {
		name, url := ParseSinkArg(tc.in)
		if name != tc.name || url != tc.url {
			t.Errorf("ParseSinkArg(%q) = %q, %q; want %q, %q", tc.in, name, url, tc.name, tc.url)
		}
	}
}

func TestFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"malformed", "sinks: [\n  - url: x\n", []string{"config file: line 1: did not find expected node content"}},
		{"unknown top key", "dsn: x\nsinkz: []\n", []string{"sinkz: unknown key (line 2)"}},
		{"unknown sink key", "sinks:\n  - url: \"stdout:\"\n    headerz: {}\n", []string{"sinks[0].headerz: unknown key (line 3)"}},
		{"unknown nested key", "sinks:\n  - url: kafka://b:9092/t\n    kafka:\n      sasl:\n        mech: PLAIN\n", []string{"sinks[0].kafka.sasl.mech: unknown key"}},
		{"bad duration", "lease_ttl: 15\nsinks:\n  - url: \"stdout:\"\n    timeout: soon\n", []string{`lease_ttl: "15" is not a duration`, `sinks[0].timeout: "soon" is not a duration`}},
		{"bad int", "retention_hours: lots\n", []string{`retention_hours: "lots" is not an integer`}},
		{"wrong shape", "tables: shop.*\n", []string{"tables: want a list"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseYAML(Default(), []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestFileNeverEchoesSecret(t *testing.T) {
	err := parseYAML(Default(), []byte("sinks:\n  - url: http://h/\n    secret: [topsecretvalue]\n"))
	if err == nil {
		t.Fatal("no error for a list as secret")
	}
	if strings.Contains(err.Error(), "topsecretvalue") {
		t.Errorf("error echoes the secret: %v", err)
	}
}

func valid() *Config {
	c := Default()
	c.DSN = goodDSN
	c.Sinks = []Sink{{URL: "stdout:"}, {Name: "hook", URL: "https://h.example/x", Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}
	c.FillSinkDefaults()
	return c
}

func TestValidate(t *testing.T) {
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want []string
	}{
		{"no dsn", func(c *Config) { c.DSN = "" }, []string{"dsn: required"}},
		{"bad dsn", func(c *Config) { c.DSN = "u:hunter2@tcp(h:3306)" }, []string{"dsn: invalid DSN"}},
		{"no sinks", func(c *Config) { c.Sinks = nil }, []string{"sinks: no sinks configured"}},
		{"unknown scheme", func(c *Config) { c.Sinks[1].URL = "ftp://x/y" }, []string{`sinks[1].url: unknown scheme "ftp" (want stdout:, file://, http://, https://, kafka://, nats://, redis://, pubsub://)`}},
		{"duplicate names", func(c *Config) { c.Sinks[1].Name = "stdout" }, []string{`sinks[1].name: duplicate sink name "stdout" (also sinks[0])`}},
		{"relative file", func(c *Config) { c.Sinks[0].URL = "file://out.jsonl" }, []string{"sinks[0].url: want file:///absolute/path.jsonl"}},
		{"claim lease vs timeout", func(c *Config) { c.ClaimLease = 5 * time.Second }, []string{"sinks[0].timeout: 10s must be shorter than claim_lease 5s", "sinks[1].timeout"}},
		{"bad format", func(c *Config) { c.Sinks[0].Format = "avro" }, []string{`sinks[0].format: "avro"`}},
		{"heartbeat too short", func(c *Config) { c.Sinks[1].Heartbeat = 10 * time.Millisecond }, []string{"sinks[1].heartbeat: must be 0 (off) or at least 100ms, got 10ms"}},
		{"unknown snapshot", func(c *Config) { c.Sinks[1].Snapshot = "always" }, []string{`sinks[1].snapshot: must be initial or never, got "always"`}},
		{"negative runway minimum", func(c *Config) { c.BinlogRunwayMin = -time.Second }, []string{"binlog_runway_min: must not be negative"}},
		{"bad op", func(c *Config) { c.Sinks[0].Ops = []string{"insert", "upsert"} }, []string{`sinks[0].ops[1]: "upsert"`}},
		{"bad table", func(c *Config) { c.Sinks[0].Tables.Include = []string{"shop"} }, []string{`sinks[0].tables.include[0]: "shop"`}},
		{"bad drop", func(c *Config) { c.Sinks[0].DropColumns = []string{"a.b"} }, []string{`sinks[0].drop_columns[0]`}},
		{"secret on stdout", func(c *Config) { c.Sinks[0].Secret = "x" }, []string{"sinks[0].secret: only http(s)"}},
		{"sasl", func(c *Config) {
			c.Sinks[0].URL = "kafka://b:9092/t"
			c.Sinks[0].Kafka = &KafkaOptions{SASL: &SASL{Mechanism: "MD5", Username: "u", Password: "pw"}}
		}, []string{`sinks[0].kafka.sasl.mechanism: "MD5"`}},
		{"kafka block on http", func(c *Config) { c.Sinks[1].Kafka = &KafkaOptions{} }, []string{"sinks[1].kafka: only for kafka://"}},
		{"max concurrency", func(c *Config) { c.Sinks[1].HTTP = &HTTPOptions{MaxConcurrency: -1} }, []string{"sinks[1].http.max_concurrency: must not be negative"}},
		{"identity", func(c *Config) { c.ChangeIdentity = "uuid" }, []string{"change_identity"}},
		{"from", func(c *Config) { c.From = "yesterday" }, []string{"from:"}},
		{"state db", func(c *Config) { c.StateDB = "a-b" }, []string{"state_db:"}},
		{"instance", func(c *Config) { c.Instance = "a:b" }, []string{"instance:"}},
		{"ttl", func(c *Config) { c.LeaseTTL = 10 * time.Millisecond }, []string{"lease_ttl:"}},
		{"dedup", func(c *Config) { c.DedupWindow = 5 * time.Second }, []string{"dedup_window:"}},
		{"segment format", func(c *Config) { c.SegmentFormat = "3" }, []string{`segment_format: "3" is not auto, 1 or 2`}},
		{"http addr", func(c *Config) { c.HTTPAddr = "8080" }, []string{"http_addr:"}},
		{"partial capture pattern", func(c *Config) { c.Tables = []string{"shop.order_*"} }, []string{"tables[0]:", "whole name"}},
		{"kafka without host", func(c *Config) { c.Sinks[0].URL = "kafka:///topic" }, []string{"sinks[0].url: want kafka://"}},
		{"pubsub without project", func(c *Config) { c.Sinks[0].URL = "pubsub:///topic" }, []string{"sinks[0].url: want pubsub://project/topic-template"}},
		{"redis without host", func(c *Config) { c.Sinks[0].URL = "redis://:pw@/stream" }, []string{"sinks[0].url: want redis://"}},
		{"many at once", func(c *Config) {
			c.DSN = ""
			c.Sinks[1].URL = "gopher://x"
			c.RetentionHours = 0
		}, []string{"dsn:", "sinks[1].url:", "retention_hours:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(c)
			err := c.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, secret := range []string{"hunter2", "s3cretpw", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error echoes a secret: %q", err)
				}
			}
		})
	}
	for _, url := range []string{"kafka://b1:9092,b2:9092/cdc.{db}.{table}", "nats://n1:4222/cdc.{db}.{table}", "redis://:pw@r1:6379/cdc.{db}.{table}?maxlen=1000", "rediss://r1", "pubsub://my-proj/cdc.{db}.{table}", "file:///tmp/x.jsonl", "stdout"} {
		c := valid()
		c.Sinks[0].URL = url
		c.Sinks[0].Name = "x"
		if err := c.Validate(); err != nil {
			t.Errorf("url %q: %v", url, err)
		}
	}
	for _, from := range []string{"now", "start", "0-1-42", "0-1-42,1-2-7", "mysql-bin.000003:4", "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5"} {
		c := valid()
		c.From = from
		if err := c.Validate(); err != nil {
			t.Errorf("from %q: %v", from, err)
		}
	}
}

func TestSecretsNeverPrint(t *testing.T) {
	s := Secret("hunter2")
	d := DSN("user:hunter2@tcp(db:3306)/x")
	j, _ := json.Marshal(struct {
		S Secret
		D DSN
	}{s, d})
	for _, out := range []string{
		s.String(), fmt.Sprint(s), fmt.Sprintf("%v %s %q %+v %#v %x", s, s, s, s, s, s),
		d.String(), fmt.Sprint(d), fmt.Sprintf("%v %s %q %#v", d, d, d, d),
		string(j), fmt.Sprintf("%+v", valid()),
	} {
		if strings.Contains(out, "hunter2") || strings.Contains(out, "s3cretpw") {
			t.Errorf("secret printed: %q", out)
		}
	}
	if got, want := d.String(), "user:[redacted]@tcp(db:3306)/x"; got != want {
		t.Errorf("DSN prints %q, want %q", got, want)
	}
	if got, want := s.Value(), "hunter2"; got != want {
		t.Errorf("Value = %q", got)
	}
	if got, want := DSNAddr(d.Value()), "user@db:3306"; got != want {
		t.Errorf("DSNAddr = %q, want %q", got, want)
	}
	if got := RedactDSN("u:hunter2@tcp(h:1)"); strings.Contains(got, "hunter2") {
		t.Errorf("RedactDSN of a bad DSN = %q", got)
	}
}

func TestTableFilter(t *testing.T) {
	f := TableFilter{Include: []string{"shop.*", "*.users"}, Exclude: []string{"shop.secret_*"}}
	for _, tc := range []struct {
		db, tbl string
		want    bool
	}{
		{"shop", "orders", true},
		{"crm", "users", true},
		{"crm", "leads", false},
		{"shop", "secret_keys", false},
	} {
		if got := f.Matches(tc.db, tc.tbl); got != tc.want {
			t.Errorf("Matches(%s.%s) = %v, want %v", tc.db, tc.tbl, got, tc.want)
		}
	}
	if !(TableFilter{}).Matches("a", "b") {
		t.Error("empty filter must match everything")
	}
}

func TestExampleFile(t *testing.T) {
	cfg, err := Resolve(Sources{Flags: []Setting{{"config", "testdata/cdcout.example.yaml"}}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ReplicaID == "" {
		t.Error("empty replica_id did not fall back to the hostname")
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := len(cfg.Sinks), 5; got != want {
		t.Fatalf("sinks = %d, want %d", got, want)
	}
	if got, want := cfg.Sinks[0].Headers["Authorization"].Value(), "Bearer abc"; got != want {
		t.Errorf("header = %q, want %q", got, want)
	}
	if got, want := cfg.Sinks[3].Kafka.SASL.Password.Value(), "kafka-secret"; got != want {
		t.Errorf("sasl password = %q", got)
	}
	if s := fmt.Sprintf("%v %+v", cfg, cfg.Sinks); strings.Contains(s, "kafka-secret") || strings.Contains(s, "Bearer abc") || strings.Contains(s, "cdc:secret@") {
		t.Errorf("config prints a secret: %s", s)
	}
}

func TestHTTPKeepAliveSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{name: "defaults"},
		{name: "headers above keep-alive", env: map[string]string{"CDCOUT_HTTP_KEEP_ALIVE": "80s", "CDCOUT_HTTP_HEADERS_TIMEOUT": "85s"}},
		{name: "headers not above keep-alive", env: map[string]string{"CDCOUT_HTTP_KEEP_ALIVE": "80s", "CDCOUT_HTTP_HEADERS_TIMEOUT": "80s"}, wantErr: "http_headers_timeout: 1m20s must exceed http_keep_alive"},
		{name: "zero keep-alive", env: map[string]string{"CDCOUT_HTTP_KEEP_ALIVE": "0s"}, wantErr: "http_keep_alive: must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"CDCOUT_DSN": "u:p@tcp(h:3306)/", "CDCOUT_SINK": "stdout:"}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg, err := Resolve(Sources{Env: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			case tc.wantErr == "" && tc.name == "defaults" && cfg.HTTPKeepAlive != 72*time.Second:
				t.Fatalf("default keep-alive = %s, want 72s", cfg.HTTPKeepAlive)
			}
		})
	}
}

func TestSetBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0", 0, true}, {"1048576", 1 << 20, true}, {"16MiB", 16 << 20, true}, {" 2 GiB", 2 << 30, true}, {"64KiB", 64 << 10, true},
		{"-1", 0, false}, {"16MB", 0, false}, {"lots", 0, false},
	} {
		var got int
		err := setBytes(&got, tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("setBytes(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestSecretFromEnvironment: a secret written ${NAME} is read from the
// environment (a Kubernetes Secret behind a ConfigMap's config), and an
// unset variable is an error at its path.
func TestSecretFromEnvironment(t *testing.T) {
	t.Setenv("CDCOUT_TEST_HOOK_SECRET", "whsec_c2VjcmV0LWZyb20tZW52")
	t.Setenv("CDCOUT_TEST_TOKEN", "tok-from-env")
	cfg := Default()
	err := parseYAML(cfg, []byte("sinks:\n  - url: http://h/\n    secret: ${CDCOUT_TEST_HOOK_SECRET}\n    headers: {Authorization: \"${CDCOUT_TEST_TOKEN}\"}\n  - url: http://h2/\n    secret: plain-$ecret-{x}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Sinks[0].Secret.Value(), "whsec_c2VjcmV0LWZyb20tZW52"; got != want {
		t.Errorf("secret = %q, want %q", got, want)
	}
	if got, want := cfg.Sinks[0].Headers["Authorization"].Value(), "tok-from-env"; got != want {
		t.Errorf("header = %q, want %q", got, want)
	}
	if got, want := cfg.Sinks[1].Secret.Value(), "plain-$ecret-{x}"; got != want {
		t.Errorf("literal secret = %q, want %q", got, want)
	}
	err = parseYAML(Default(), []byte("sinks:\n  - url: http://h/\n    secret: ${CDCOUT_TEST_UNSET_SECRET}\n"))
	if err == nil || !strings.Contains(err.Error(), "sinks[0].secret: environment variable CDCOUT_TEST_UNSET_SECRET is not set") {
		t.Fatalf("unset variable: %v", err)
	}
}
