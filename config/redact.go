package config

import (
	"regexp"
	"strings"
)

// minWholeSecret is the shortest secret value RedactText replaces wherever
// it appears. A shorter one is not searched for in free text: with the
// password "e", every "e" of a message would go ("conn[redacted]ct to …").
// Where a short secret is written into text, it is written in a structure
// (a DSN's or a URL's user info), and those are redacted by their shape.
const minWholeSecret = 8

var (
	// scheme://user:password@host
	urlUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@"']*):[^\s/@"']*@`)
	// user:password@tcp(host)/db, user:password@unix(/sock)/db,
	// user:password@/db: the driver splits at the last '@', so may the
	// password hold '@' and ':'; the greedy match does the same. It stops
	// at quotes so that it never spans two JSON strings
	// ({"connected":true,"dsn":"u@tcp(…)"}).
	dsnUserinfo = regexp.MustCompile(`(^|[\s"'=,;(\[])([^\s:@/"'(=,;\[]*):[^\s"']*@((?:tcp|tcp4|tcp6|udp|unix)\(|/)`)
)

// RedactText removes secrets from a message by structure: the password of
// any DSN or URL in it, and the given secret values (webhook secrets,
// tokens, header values marked secret) when at least minWholeSecret long.
// Everything else is left as written.
func RedactText(msg string, secrets ...string) string {
	msg = dsnUserinfo.ReplaceAllString(msg, "${1}${2}:"+redacted+"@${3}")
	msg = urlUserinfo.ReplaceAllString(msg, "${1}:"+redacted+"@")
	for _, s := range secrets {
		if len(s) >= minWholeSecret {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	return msg
}
