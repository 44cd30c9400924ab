package config

import (
	"cmp"
	"errors"
	"io/fs"
	"os"
	"strings"
)

// minSecretLen is the shortest admin token and hash key accepted: a
// bearer token guards writes that re-queue and pause deliveries, and an
// HMAC is as strong as its key (a short one can be searched for from a
// known value), so a guessable one is refused at start.
const minSecretLen = 16

// AdminTokenValue is the admin API's bearer token: admin_token, or the
// contents of admin_token_file read by Validate (trailing whitespace,
// such as the newline an editor adds, removed). "" means the admin API's
// write endpoints are off.
func (c *Config) AdminTokenValue() Secret { return cmp.Or(c.AdminToken, c.adminFileToken) }

// validateAdmin checks the admin settings and reads admin_token_file.
// No message quotes the token or the file's contents.
func (c *Config) validateAdmin(errs *Errors) {
	c.adminFileToken = readSecretFile(errs, "", "admin_token", "admin_token_file", c.AdminToken, c.AdminTokenFile)
	tok := c.AdminTokenValue()
	if tok != "" {
		if len(tok.Value()) < minSecretLen {
			errs.add(c.adminTokenField(), "the token is %d characters long; use at least %d (e.g. openssl rand -hex 32)", len(tok.Value()), minSecretLen)
		}
		if strings.ContainsAny(tok.Value(), " \t\r\n") {
			errs.add(c.adminTokenField(), "the token contains whitespace; a bearer token cannot")
		}
	}
	if c.AdminAddr != "" {
		if tok == "" && c.AdminTokenFile == "" {
			errs.add("admin_addr", "serves the admin API, which needs admin_token or admin_token_file")
		}
		checkListenAddr(errs, "admin_addr", c.AdminAddr)
		if c.AdminAddr == c.HTTPAddr {
			errs.add("admin_addr", "%q is http_addr too; leave admin_addr unset to serve the admin API on http_addr", c.AdminAddr)
		}
	}
	if c.AdminReadAuth && tok == "" && c.AdminTokenFile == "" {
		errs.add("admin_read_auth", "puts the read endpoints behind the admin token, which needs admin_token or admin_token_file")
	}
}

func (c *Config) adminTokenField() string {
	if c.AdminToken != "" {
		return "admin_token"
	}
	return "admin_token_file"
}

// readSecretFile reads the secret file of a setting that takes a value
// (inline) or a file: the file's contents without trailing whitespace,
// "" when there is no file. It reports a file given with a value, and a
// missing, unreadable or empty file, under prefix+fileKey; no message
// quotes the contents.
func readSecretFile(errs *Errors, prefix, inlineKey, fileKey string, inline Secret, file string) Secret {
	switch {
	case file == "":
		return ""
	case inline != "":
		errs.add(prefix+fileKey, "set %s or %s, not both", inlineKey, fileKey)
		return ""
	}
	b, err := os.ReadFile(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		errs.add(prefix+fileKey, "%s does not exist", file)
	case err != nil:
		// A PathError names the file and the reason, never the contents.
		errs.add(prefix+fileKey, "%v", err)
	default:
		if v := Secret(strings.TrimRight(string(b), " \t\r\n")); v != "" {
			return v
		}
		errs.add(prefix+fileKey, "%s is empty", file)
	}
	return ""
}
