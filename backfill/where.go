package backfill

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// whereDenied are the words a backfill's WHERE condition may not use
// outside string literals: each would let the condition read another
// table, write, wait or reach outside the row it filters.
var whereDenied = map[string]bool{
	"select": true, "union": true, "from": true, "into": true, "outfile": true, "dumpfile": true,
	"insert": true, "update": true, "delete": true, "replace": true, "drop": true, "alter": true,
	"create": true, "truncate": true, "grant": true, "call": true, "do": true, "handler": true,
	"load_file": true, "sleep": true, "benchmark": true, "get_lock": true, "release_lock": true,
	"release_all_locks": true, "master_pos_wait": true, "source_pos_wait": true, "master_gtid_wait": true,
	"wait_for_executed_gtid_set": true, "wait_until_sql_thread_after_gtids": true, "lock": true,
	"for": true, "procedure": true, "limit": true, "window": true, "over": true,
}

// CheckWhere refuses a backfill condition that could be more than a
// filter of the table's rows. The condition is spliced into
// SELECT … FROM <table> WHERE (<condition>) AND <key range> ORDER BY …
// (and checked first with LIMIT 0, so the server resolves every name), and
// whoever can write it — an operator's command line, the signal table, the
// admin endpoint — can therefore make the backfill read any row of that
// table and send it to the sinks: that is the trust model. What it must not
// do is leave the parenthesis it is put in, end the statement, read
// another table (a subquery), write, or make the server wait, so it may
// hold no statement separator, comment, user variable, unbalanced
// parenthesis or any of whereDenied's words outside string literals.
func CheckWhere(where string) error {
	if strings.TrimSpace(where) == "" {
		return errors.New("empty condition")
	}
	depth := 0
	for i := 0; i < len(where); i++ {
		c := where[i]
		switch {
		case c == '\'' || c == '"':
			end, err := literalEnd(where, i)
			if err != nil {
				return err
			}
			i = end
		case c == '`':
			end := strings.IndexByte(where[i+1:], '`')
			if end < 0 {
				return errors.New("unterminated quoted identifier")
			}
			i += end + 1
			for i+1 < len(where) && where[i+1] == '`' { // `` inside a quoted name
				next := strings.IndexByte(where[i+2:], '`')
				if next < 0 {
					return errors.New("unterminated quoted identifier")
				}
				i += next + 2
			}
		case c == ';':
			return errors.New("';' is not allowed: the condition must be one expression")
		case c == '#' || c == '-' && i+1 < len(where) && where[i+1] == '-' || c == '/' && i+1 < len(where) && where[i+1] == '*':
			return errors.New("comments are not allowed")
		case c == '@':
			return errors.New("variables (@) are not allowed")
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth < 0 {
				return errors.New("unbalanced ')'")
			}
		case c == '_' || unicode.IsLetter(rune(c)):
			j := i
			for j < len(where) && (where[j] == '_' || where[j] == '$' || unicode.IsLetter(rune(where[j])) || unicode.IsDigit(rune(where[j]))) {
				j++
			}
			if w := strings.ToLower(where[i:j]); whereDenied[w] {
				return fmt.Errorf("%q is not allowed: the condition may only filter the table's rows", w)
			}
			i = j - 1
		}
	}
	if depth != 0 {
		return errors.New("unbalanced '('")
	}
	return nil
}

// literalEnd is the index of the quote closing the string literal that
// starts at i (a doubled quote inside). A backslash is refused: whether it
// escapes the quote after it depends on the server's sql_mode
// (NO_BACKSLASH_ESCAPES), so this check and the server could disagree on
// where the literal ends.
func literalEnd(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			return 0, errors.New("backslashes in string literals are not allowed (their meaning depends on sql_mode); double a quote to escape it")
		case q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j, nil
		}
	}
	return 0, errors.New("unterminated string literal")
}
