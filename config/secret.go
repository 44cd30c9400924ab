package config

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
	"go.yaml.in/yaml/v3"
)

// redacted is what a secret prints as, everywhere.
const redacted = "[redacted]"

// Secret is a string that never prints: String, Format (every verb),
// MarshalJSON and MarshalYAML all give "[redacted]", so a secret that ends up
// in a log field, an error or a dumped config does not leak. Value returns
// the real string for the one place that needs it.
type Secret string

// Value returns the secret itself.
func (s Secret) Value() string { return string(s) }

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer (%#v).
func (s Secret) GoString() string { return s.String() }

// Format implements fmt.Formatter so that %s, %v, %q, %x and friends all
// print the redacted form.
func (s Secret) Format(f fmt.State, verb rune) { formatRedacted(f, verb, s.String()) }

// formatRedacted prints a secret's redacted form for any verb, quoted for %q.
func formatRedacted(f fmt.State, verb rune, redacted string) {
	if verb == 'q' {
		fmt.Fprintf(f, "%q", redacted)
		return
	}
	fmt.Fprint(f, redacted)
}

// UnmarshalYAML reads a secret written as is, or as "${NAME}": the value
// of environment variable NAME, so that a configuration file (a
// Kubernetes ConfigMap) can name secrets that come from elsewhere (a
// Secret) without holding them.
func (s *Secret) UnmarshalYAML(n *yaml.Node) error {
	if name, ok := secretEnvRef(n.Value); ok {
		v, set := os.LookupEnv(name)
		if !set {
			return fmt.Errorf("environment variable %s is not set", name)
		}
		*s = Secret(v)
		return nil
	}
	*s = Secret(n.Value)
	return nil
}

var envRef = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$`)

// secretEnvRef reports the variable a "${NAME}" secret names.
func secretEnvRef(v string) (string, bool) {
	m := envRef.FindStringSubmatch(v)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// MarshalJSON implements json.Marshaler.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + s.String() + `"`), nil }

// MarshalYAML implements yaml.Marshaler.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// DSN is a go-sql-driver data source name. It prints with its password
// replaced (see RedactDSN), so a DSN can be logged and put into errors.
type DSN string

// Value returns the DSN itself, password included.
func (d DSN) Value() string { return string(d) }

// String implements fmt.Stringer.
func (d DSN) String() string { return RedactDSN(string(d)) }

// GoString implements fmt.GoStringer (%#v).
func (d DSN) GoString() string { return d.String() }

// Format implements fmt.Formatter.
func (d DSN) Format(f fmt.State, verb rune) { formatRedacted(f, verb, d.String()) }

// MarshalJSON implements json.Marshaler.
func (d DSN) MarshalJSON() ([]byte, error) { return []byte(fmt.Sprintf("%q", d.String())), nil }

// MarshalYAML implements yaml.Marshaler.
func (d DSN) MarshalYAML() (any, error) { return d.String(), nil }

// RedactDSN returns dsn with its password blanked: "user:[redacted]@tcp(h:3306)/db".
// A DSN that does not parse is reduced to what surely holds no password
// (the part after the last '@'), because a half-parsed DSN may still carry one.
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		if i := strings.LastIndex(dsn, "@"); i >= 0 {
			return redacted + "@" + dsn[i+1:]
		}
		return redacted
	}
	if cfg.Passwd != "" {
		cfg.Passwd = redacted
	}
	return cfg.FormatDSN()
}

// DSNAddr is the user@address form of dsn, for one-line errors.
func DSNAddr(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "[unparsable dsn]"
	}
	addr := cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:3306"
	}
	if cfg.User == "" {
		return addr
	}
	return cfg.User + "@" + addr
}
