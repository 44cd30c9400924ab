package binlog

import (
	"strings"
	"unicode"

	"go.uber.org/zap"
)

// TableDDL is a TRUNCATE or DROP TABLE of a captured table. The binlog
// carries it as a statement, not as row images, so it produces no row
// change: consumers keep the rows it removed, unless their sink has
// schema-change records (Config.DDLRecords, ddlrecord.go). The stream
// logs each one at warn and reports it (Config.OnTableDDL) so it is at
// least seen and counted, never silently dropped.
type TableDDL struct {
	// Statement is "TRUNCATE" or "DROP TABLE".
	Statement string
	DB, Table string
	// GTID and File/Pos locate the statement in the binlog.
	GTID string
	File string
	Pos  uint32
}

// tableDDL reports the captured tables a TRUNCATE or DROP TABLE statement
// empties or removes.
func (r *reader) tableDDL(q []byte, defaultDB string, pos uint32) {
	stmt, tables := emptiedTables(string(q), defaultDB)
	for _, t := range tables {
		if !r.s.filter.match(t[0], t[1]) {
			continue
		}
		d := TableDDL{Statement: stmt, DB: t[0], Table: t[1], GTID: r.tx.gtid, File: r.file, Pos: pos}
		msg := stmt + " of a captured table: no change records are written for it, consumers keep the rows it removed"
		if r.s.cfg.DDLRecords {
			msg = stmt + " of a captured table: consumers of sinks without ddl: true keep the rows it removed"
		}
		r.s.log.Warn(msg,
			zap.String("table", d.DB+"."+d.Table), zap.String("gtid", d.GTID), zap.String("file", d.File), zap.Uint32("pos", d.Pos))
		if r.s.cfg.OnTableDDL != nil {
			r.s.cfg.OnTableDDL(d)
		}
	}
}

// emptiedTables parses TRUNCATE [TABLE] t and DROP [TEMPORARY] TABLE [IF
// EXISTS] t1, t2, … (names plain or backquoted, optionally db-qualified;
// defaultDB for the unqualified) and returns the statement kind and its
// (db, table) pairs; nothing for any other statement.
func emptiedTables(q, defaultDB string) (string, [][2]string) {
	toks := ddlTokens(q)
	upper := func(i int) string {
		if i < len(toks) && !toks[i].quoted {
			return strings.ToUpper(toks[i].s)
		}
		return ""
	}
	i := 0
	var stmt string
	switch upper(0) {
	case "TRUNCATE":
		stmt, i = "TRUNCATE", 1
		if upper(i) == "TABLE" {
			i++
		}
	case "DROP":
		i = 1
		if upper(i) == "TEMPORARY" {
			i++
		}
		if upper(i) != "TABLE" {
			return "", nil
		}
		stmt, i = "DROP TABLE", i+1
		if upper(i) == "IF" && upper(i+1) == "EXISTS" {
			i += 2
		}
	default:
		return "", nil
	}
	var out [][2]string
	for i < len(toks) {
		t := toks[i]
		if !t.quoted && !isIdent(t.s) {
			break
		}
		db, name := defaultDB, t.s
		i++
		if i+1 < len(toks) && toks[i].s == "." && !toks[i].quoted {
			db, name = t.s, toks[i+1].s
			i += 2
		}
		out = append(out, [2]string{db, name})
		if stmt == "TRUNCATE" || i >= len(toks) || toks[i].s != "," || toks[i].quoted {
			break
		}
		i++
	}
	return stmt, out
}

type ddlToken struct {
	s      string
	quoted bool
}

// ddlTokens splits a statement into words, backquoted names, string
// literals and single punctuation characters, skipping /* */ and --
// comments.
func ddlTokens(q string) []ddlToken {
	var toks []ddlToken
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			i++
		case strings.HasPrefix(q[i:], "/*"):
			end := strings.Index(q[i+2:], "*/")
			if end < 0 {
				return toks
			}
			i += end + 4
		case strings.HasPrefix(q[i:], "-- ") || c == '#':
			end := strings.IndexByte(q[i:], '\n')
			if end < 0 {
				return toks
			}
			i += end + 1
		case c == '`':
			var b strings.Builder
			j := i + 1
			for j < len(q) {
				if q[j] == '`' {
					if j+1 < len(q) && q[j+1] == '`' {
						b.WriteByte('`')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(q[j])
				j++
			}
			toks = append(toks, ddlToken{s: b.String(), quoted: true})
			i = j + 1
		case c == '\'' || c == '"':
			// A string literal (a COMMENT, a DEFAULT): one token, never a
			// name or a keyword.
			j := i + 1
			for j < len(q) && q[j] != c {
				if q[j] == '\\' {
					j++
				}
				j++
			}
			toks = append(toks, ddlToken{s: q[i:min(j+1, len(q))]})
			i = j + 1
		case isIdentByte(c):
			j := i
			for j < len(q) && isIdentByte(q[j]) {
				j++
			}
			toks = append(toks, ddlToken{s: q[i:j]})
			i = j
		default:
			toks = append(toks, ddlToken{s: string(c)})
			i++
		}
	}
	return toks
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c))
}

func isIdent(s string) bool { return s != "" && isIdentByte(s[0]) }
