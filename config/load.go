package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// FieldError is one configuration problem at a field path: "sinks[1].url",
// "--lease-ttl" or "CDCOUT_LEASE_TTL".
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Msg }

// Errors is every problem found, in order. Its Error is one line so the
// command can print it as such.
type Errors []FieldError

func (e Errors) Error() string {
	parts := make([]string, len(e))
	for i, fe := range e {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

func (e *Errors) add(path, format string, args ...any) {
	*e = append(*e, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (e Errors) err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}

// Setting is one command-line flag the user set, by flag name
// ("lease-ttl"). Repeatable flags (sink) appear once per value.
type Setting struct {
	Name  string
	Value string
}

// Sources are the layers above the defaults.
type Sources struct {
	// Flags the user set on the command line.
	Flags []Setting
	// Env looks up environment variables (os.LookupEnv); nil means none.
	Env func(string) (string, bool)
	// SinksOptional lets Load accept a configuration without sinks
	// (cdcout backfill can feed the pipes the running fleet serves).
	SinksOptional bool
}

// EnvName is the environment variable of a flag: "lease-ttl" →
// "CDCOUT_LEASE_TTL".
func EnvName(flag string) string {
	return "CDCOUT_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// setter applies one flag or environment value.
type setter func(c *Config, v string) error

// settings maps every flag name (and so every CDCOUT_ variable) to its
// field. "config" and "sink" are handled by Resolve itself.
var settings = map[string]setter{
	"dsn":                    func(c *Config, v string) error { c.DSN = DSN(v); return nil },
	"state-dsn":              func(c *Config, v string) error { c.StateDSN = DSN(v); return nil },
	"state-db":               func(c *Config, v string) error { c.StateDB = v; return nil },
	"tables":                 func(c *Config, v string) error { c.Tables = splitList(v); return nil },
	"instance":               func(c *Config, v string) error { c.Instance = v; return nil },
	"replica-id":             func(c *Config, v string) error { c.ReplicaID = v; return nil },
	"server-id":              func(c *Config, v string) error { return setUint32(&c.ServerID, v) },
	"from":                   func(c *Config, v string) error { c.From = v; return nil },
	"reset-position":         func(c *Config, v string) error { return setBool(&c.ResetPosition, v) },
	"change-identity":        func(c *Config, v string) error { c.ChangeIdentity = v; return nil },
	"log-level":              func(c *Config, v string) error { c.LogLevel = v; return nil },
	"log-format":             func(c *Config, v string) error { c.LogFormat = v; return nil },
	"retention-hours":        func(c *Config, v string) error { return setInt(&c.RetentionHours, v) },
	"lease-ttl":              func(c *Config, v string) error { return setDuration(&c.LeaseTTL, v) },
	"dedup-window":           func(c *Config, v string) error { return setDuration(&c.DedupWindow, v) },
	"claim-lease":            func(c *Config, v string) error { return setDuration(&c.ClaimLease, v) },
	"http-addr":              func(c *Config, v string) error { c.HTTPAddr = v; return nil },
	"http-keep-alive":        func(c *Config, v string) error { return setDuration(&c.HTTPKeepAlive, v) },
	"http-headers-timeout":   func(c *Config, v string) error { return setDuration(&c.HTTPHeadersTimeout, v) },
	"binlog-runway-min":      func(c *Config, v string) error { return setDuration(&c.BinlogRunwayMin, v) },
	"backfill-chunk-size":    func(c *Config, v string) error { return setInt(&c.BackfillChunkSize, v) },
	"handoff-buffer-size":    func(c *Config, v string) error { return setInt(&c.HandoffBufferSize, v) },
	"enqueue-batch-size":     func(c *Config, v string) error { return setInt(&c.EnqueueBatchSize, v) },
	"enqueue-flush-interval": func(c *Config, v string) error { return setDuration(&c.EnqueueFlushInterval, v) },
	"enqueue-max-buffer":     func(c *Config, v string) error { return setInt(&c.EnqueueMaxBuffer, v) },
	"enqueue-pipeline":       func(c *Config, v string) error { return setBool(&c.EnqueuePipeline, v) },
	"segment-format":         func(c *Config, v string) error { c.SegmentFormat = v; return nil },
	"max-row-bytes":          func(c *Config, v string) error { return setBytes(&c.MaxRowBytes, v) },
	"shutdown-timeout":       func(c *Config, v string) error { return setDuration(&c.ShutdownTimeout, v) },
	"admin-token":            func(c *Config, v string) error { c.AdminToken = Secret(v); return nil },
	"admin-token-file":       func(c *Config, v string) error { c.AdminTokenFile = v; return nil },
	"admin-addr":             func(c *Config, v string) error { c.AdminAddr = v; return nil },
	"admin-read-auth":        func(c *Config, v string) error { return setBool(&c.AdminReadAuth, v) },
}

// SettingNames lists every name Resolve accepts as a flag or (as
// CDCOUT_<NAME>) environment variable, including "config" and "sink".
func SettingNames() []string {
	names := []string{"config", "sink"}
	for n := range settings {
		names = append(names, n)
	}
	return names
}

// setBytes reads a byte count: a plain number, or one with a KiB, MiB or
// GiB suffix ("16MiB").
func setBytes(dst *int, v string) error {
	s := strings.TrimSpace(v)
	mult := 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a byte count (use a number of bytes, or one with KiB, MiB or GiB, like 16MiB)", v)
	}
	*dst = n * mult
	return nil
}

// setParsed sets *dst to v parsed (spaces trimmed), or says what v must be.
func setParsed[T any](dst *T, v string, parse func(string) (T, error), want string) error {
	x, err := parse(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("%q is not %s", v, want)
	}
	*dst = x
	return nil
}

func setDuration(dst *time.Duration, v string) error {
	return setParsed(dst, v, time.ParseDuration, "a duration (use Go syntax like 500ms, 15s, 5m)")
}

func setInt(dst *int, v string) error { return setParsed(dst, v, strconv.Atoi, "an integer") }

func setUint32(dst *uint32, v string) error {
	return setParsed(dst, v, func(s string) (uint32, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		return uint32(n), err
	}, "an integer between 0 and 4294967295")
}

func setBool(dst *bool, v string) error { return setParsed(dst, v, strconv.ParseBool, "true or false") }

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Resolve builds the configuration: defaults, then the YAML file (--config
// or CDCOUT_CONFIG), then CDCOUT_* variables, then flags. It reports parse
// problems (bad YAML, unknown keys, a duration that is not one); call
// Validate for the rest.
//
// Sinks given with --sink (or, without any --sink, CDCOUT_SINK, several
// separated by spaces) are merged into the file's by name: a known name
// gets the new URL and keeps the file's options, a new name is appended.
// So a file can hold a sink's options while the URL (and any credential in
// it) comes from the environment.
func Resolve(src Sources) (*Config, error) {
	cfg, errs, _ := resolve(src)
	return cfg, errs.err()
}

// Load is Resolve and then Validate, reporting every problem of both in
// one round: a bad webhook secret alongside a bad duration, not after it
// is fixed. Validate is skipped only when the file could not be read or
// decoded, since every setting it holds would then be reported missing.
func Load(src Sources) (*Config, error) {
	cfg, errs, fileOK := resolve(src)
	if fileOK {
		var verrs Errors
		if err := cfg.Validate(); err != nil && !errors.As(err, &verrs) {
			return cfg, err
		}
		for _, fe := range verrs {
			if src.SinksOptional && fe.Path == "sinks" && len(cfg.Sinks) == 0 {
				continue
			}
			errs = append(errs, fe)
		}
	}
	return cfg, errs.err()
}

func resolve(src Sources) (*Config, Errors, bool) {
	cfg := Default()
	fileOK := true
	env := src.Env
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	var errs Errors

	file, _ := env(EnvName("config"))
	for _, s := range src.Flags {
		if s.Name == "config" {
			file = s.Value
		}
	}
	if file != "" {
		if err := LoadFile(cfg, file); err != nil {
			fileOK = false
			var fe Errors
			if errors.As(err, &fe) {
				errs = append(errs, fe...)
			} else {
				errs.add("--config", "%v", err)
			}
		}
	}

	for name, set := range settings {
		if v, ok := env(EnvName(name)); ok {
			if err := set(cfg, v); err != nil {
				errs.add(EnvName(name), "%v", err)
			}
		}
	}
	var sinkFlags []string
	for _, s := range src.Flags {
		switch s.Name {
		case "config":
		case "sink":
			sinkFlags = append(sinkFlags, s.Value)
		default:
			set, ok := settings[s.Name]
			if !ok {
				errs.add("--"+s.Name, "unknown setting")
				continue
			}
			if err := set(cfg, s.Value); err != nil {
				errs.add("--"+s.Name, "%v", err)
			}
		}
	}
	sinkPath := "--sink"
	if len(sinkFlags) == 0 {
		if v, ok := env(EnvName("sink")); ok {
			sinkFlags = strings.Fields(v)
			sinkPath = EnvName("sink")
		}
	}
	fromFile := len(cfg.Sinks)
	for i, v := range sinkFlags {
		name, url := ParseSinkArg(v)
		if url == "" {
			errs.add(fmt.Sprintf("%s[%d]", sinkPath, i), "empty URL (want [NAME=]URL)")
			continue
		}
		mergeSink(cfg, fromFile, name, url)
	}
	if cfg.ReplicaID == "" {
		// "replica_id: ''" in a shared file means "use the default".
		cfg.ReplicaID = Default().ReplicaID
	}
	cfg.FillSinkDefaults()
	return cfg, errs, fileOK
}

// ParseSinkArg splits a --sink value "[NAME=]URL". The part before the first
// '=' is a name only if it could not be part of a URL (no ':' or '/'), so
// "http://h/?a=b" stays a URL. NAME defaults to the URL's scheme.
func ParseSinkArg(v string) (name, url string) {
	v = strings.TrimSpace(v)
	if i := strings.IndexByte(v, '='); i > 0 && !strings.ContainsAny(v[:i], ":/") {
		name, url = v[:i], v[i+1:]
	} else {
		url = v
	}
	if name == "" {
		name = schemeOf(url)
	}
	return name, url
}

// mergeSink gives the file's sink called name (among the first fromFile)
// the URL, or appends a new sink. Two --sink values with one name are both
// appended, so Validate reports the duplicate instead of one silently
// replacing the other.
func mergeSink(cfg *Config, fromFile int, name, url string) {
	for i := range cfg.Sinks[:fromFile] {
		n := cfg.Sinks[i].Name
		if n == "" {
			n = schemeOf(cfg.Sinks[i].URL)
		}
		if n == name {
			cfg.Sinks[i].Name, cfg.Sinks[i].URL = name, url
			return
		}
	}
	cfg.Sinks = append(cfg.Sinks, Sink{Name: name, URL: url})
}

// schemeOf returns the scheme of a sink URL ("stdout" for "stdout:").
// A bare "stdout" counts too: in YAML, an unquoted "stdout:" is a mapping.
func schemeOf(url string) string {
	if url == "stdout" {
		return "stdout"
	}
	if i := strings.Index(url, ":"); i > 0 {
		return strings.ToLower(url[:i])
	}
	return ""
}

// LoadFile reads a YAML file into cfg, over whatever cfg already holds.
func LoadFile(cfg *Config, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return Errors{{Path: "--config", Msg: fmt.Sprintf("read %s: %v", path, unwrapPathError(err))}}
	}
	cfg.File = path
	err = parseYAML(cfg, data)
	var errs Errors
	if errors.As(err, &errs) {
		for i := range errs {
			if errs[i].Path == fileLevel {
				errs[i].Path = path
			}
		}
	}
	return err
}

// fileLevel is the path of a problem with the file as a whole (its YAML
// syntax); LoadFile puts the file's name there.
const fileLevel = "config file"

// yamlError is a YAML parser's error as one line without the parser's
// "yaml: " prefix, with a hint for the mistake everyone makes: an
// unquoted value holding ": " or ending in ':' (url: stdout:).
func yamlError(err error) string {
	msg := strings.TrimPrefix(oneLine(err.Error()), "yaml: ")
	if strings.Contains(msg, "mapping values are not allowed") {
		msg += ` (a value that contains ": " or ends with ':' must be quoted, e.g. url: "stdout:")`
	}
	return msg
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// parseYAML decodes YAML into cfg. Unknown keys and values of the wrong type
// are reported with their field path and line, all of them at once.
func parseYAML(cfg *Config, data []byte) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Errors{{Path: fileLevel, Msg: yamlError(err)}}
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil // an empty file
	}
	var errs Errors
	checkNode(root.Content[0], reflect.TypeFor[Config](), "", &errs)
	if len(errs) > 0 {
		return errs
	}
	// The walk above has already checked keys and types; KnownFields is a
	// second line of defence should the two ever disagree.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return Errors{{Path: fileLevel, Msg: yamlError(err)}}
	}
	return nil
}

func oneLine(s string) string {
	s = strings.TrimPrefix(s, "yaml: ")
	return strings.Join(strings.Fields(s), " ")
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	secretType   = reflect.TypeFor[Secret]()
)

// checkNode walks a YAML node against the Go type it will decode into and
// records unknown keys and malformed scalars with their paths.
func checkNode(n *yaml.Node, t reflect.Type, path string, errs *Errors) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	at := func() string {
		if path == "" {
			return "config"
		}
		return path
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			errs.add(at(), "want a duration like 15s (line %d)", n.Line)
		} else if _, err := time.ParseDuration(n.Value); err != nil {
			errs.add(at(), "%q is not a duration (use Go syntax like 500ms, 15s, 5m; line %d)", n.Value, n.Line)
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			errs.add(at(), "want a mapping of keys (line %d)", n.Line)
			return
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if tag == "" || tag == "-" {
				continue
			}
			fields[tag] = f.Type
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			ft, ok := fields[k.Value]
			if !ok {
				errs.add(p, "unknown key (line %d)", k.Line)
				continue
			}
			checkNode(v, ft, p, errs)
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			errs.add(at(), "want a list (line %d)", n.Line)
			return
		}
		for i, c := range n.Content {
			checkNode(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			errs.add(at(), "want a mapping (line %d)", n.Line)
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			checkNode(n.Content[i+1], t.Elem(), path+"."+n.Content[i].Value, errs)
		}
	default:
		if n.Kind != yaml.ScalarNode {
			errs.add(at(), "want a single value (line %d)", n.Line)
			return
		}
		switch t.Kind() {
		case reflect.Bool:
			if _, err := strconv.ParseBool(n.Value); err != nil {
				errs.add(at(), "%q is not true or false (line %d)", n.Value, n.Line)
			}
		case reflect.Int, reflect.Int64, reflect.Int32:
			if _, err := strconv.ParseInt(n.Value, 10, 64); err != nil {
				errs.add(at(), "%q is not an integer (line %d)", n.Value, n.Line)
			}
		case reflect.Uint32, reflect.Uint64, reflect.Uint:
			if _, err := strconv.ParseUint(n.Value, 10, t.Bits()); err != nil {
				errs.add(at(), "%q is not a non-negative integer (line %d)", n.Value, n.Line)
			}
		case reflect.String:
			if t == secretType {
				if name, ok := secretEnvRef(n.Value); ok {
					if _, set := os.LookupEnv(name); !set {
						errs.add(at(), "environment variable %s is not set (line %d)", name, n.Line)
					}
				}
				return // never quote a secret back
			}
		}
	}
}
