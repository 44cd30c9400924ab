package config

import (
	"errors"
	"io/fs"
	"os"
	"strings"
)

// MinAdminTokenLen is the shortest admin token accepted: a bearer token
// guards writes that re-queue and pause deliveries, so a guessable one
// is refused at start rather than discovered later.
const MinAdminTokenLen = 16

// AdminTokenValue is the admin API's bearer token: admin_token, or the
// contents of admin_token_file read by Validate (trailing whitespace,
// such as the newline an editor adds, removed). "" means the admin API's
// write endpoints are off.
func (c *Config) AdminTokenValue() Secret {
	if c.AdminToken != "" {
		return c.AdminToken
	}
	return c.adminFileToken
}

// validateAdmin checks the admin settings and reads admin_token_file.
// No message quotes the token or the file's contents.
func (c *Config) validateAdmin(errs *Errors) {
	c.adminFileToken = ""
	switch {
	case c.AdminToken != "" && c.AdminTokenFile != "":
		errs.add("admin_token_file", "set admin_token or admin_token_file, not both")
	case c.AdminTokenFile != "":
		b, err := os.ReadFile(c.AdminTokenFile)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			errs.add("admin_token_file", "%s does not exist", c.AdminTokenFile)
		case err != nil:
			// A PathError names the file and the reason, never the contents.
			errs.add("admin_token_file", "%v", err)
		default:
			c.adminFileToken = Secret(strings.TrimRight(string(b), " \t\r\n"))
			if c.adminFileToken == "" {
				errs.add("admin_token_file", "%s is empty", c.AdminTokenFile)
			}
		}
	}
	tok := c.AdminTokenValue()
	if tok != "" {
		if len(tok.Value()) < MinAdminTokenLen {
			errs.add(c.adminTokenField(), "the token is %d characters long; use at least %d (e.g. openssl rand -hex 32)", len(tok.Value()), MinAdminTokenLen)
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
