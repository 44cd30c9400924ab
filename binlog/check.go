package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
)

// ErrServerNotReady is wrapped by every start-up check failure: the server
// (or the replication user) must be reconfigured before cdcout can read it.
var ErrServerNotReady = errors.New("server not ready for change capture")

// ErrServerIDInUse means another connected replica registered the server
// id this stream would use. It comes wrapped with ErrServerNotReady; a
// derived id still in use is usually the previous process of the same
// replica, not yet reaped by the server, so a caller may retry for a while.
var ErrServerIDInUse = errors.New("server id in use by a connected replica")

// serverIDInUse is a not-ready error that also matches ErrServerIDInUse.
type serverIDInUse struct{ err error }

func (e serverIDInUse) Error() string        { return e.err.Error() }
func (e serverIDInUse) Unwrap() error        { return e.err }
func (e serverIDInUse) Is(target error) bool { return target == ErrServerIDInUse }

func notReady(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrServerNotReady)...)
}

// serverVars are the global variables the checks read.
type serverVars map[string]string

func readVars(ctx context.Context, db *sql.DB) (serverVars, error) {
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL VARIABLES WHERE Variable_name IN "+
		"('log_bin','binlog_format','binlog_row_image','binlog_row_metadata','server_id','server_uuid','gtid_mode','version')")
	if err != nil {
		return nil, fmt.Errorf("read server variables: %w", err)
	}
	defer rows.Close()
	v := serverVars{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, fmt.Errorf("read server variables: %w", err)
		}
		v[strings.ToLower(name)] = value
	}
	return v, rows.Err()
}

// checkBinlog reports a binary log that cdcout cannot read row changes
// from: off, not ROW, or not FULL row images.
func (v serverVars) checkBinlog(addr string) error {
	if on := strings.ToUpper(v["log_bin"]); on != "ON" && on != "1" {
		return notReady("the binary log is off on %s: start the server with --log-bin --binlog-format=ROW "+
			"--binlog-row-image=FULL --binlog-row-metadata=FULL --server-id=<unique non-zero id> "+
			"(or set log_bin, binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL and server_id in its config)", addr)
	}
	if f := strings.ToUpper(v["binlog_format"]); f != "ROW" {
		return notReady("binlog_format is %s on %s, cdcout needs ROW: run SET GLOBAL binlog_format = 'ROW' "+
			"and put binlog_format=ROW in the server config (sessions opened before keep the old format)", f, addr)
	}
	if img := strings.ToUpper(v["binlog_row_image"]); img != "" && img != "FULL" {
		return notReady("binlog_row_image is %s on %s, cdcout needs FULL (complete before and after images): "+
			"run SET GLOBAL binlog_row_image = 'FULL' and put binlog_row_image=FULL in the server config", img, addr)
	}
	return nil
}

// Preflight checks the binary log settings of the server dsn names (on,
// ROW, FULL row images) without opening a stream, so `cdcout run` can refuse
// a server it will never read before it creates anything. A settings
// problem wraps ErrServerNotReady; any other error (the server does not
// answer yet) is returned as it is, for the caller to decide.
func Preflight(ctx context.Context, dsn string) error {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("parse DSN: %w", err)
	}
	addr := cfg.User + "@" + cfg.Addr
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	v, err := readVars(ctx, db)
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	return v.checkBinlog(addr)
}

// check runs the start-up checks and fills s.info. Each failure says what
// to change on the server, because the person reading it is setting up
// replication, not debugging cdcout.
func (s *Stream) check(ctx context.Context) error {
	var version string
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return fmt.Errorf("query server version: %w", err)
	}
	s.info.Version = version
	s.info.Flavor = gomysql.MySQLFlavor
	if strings.Contains(strings.ToLower(version), "mariadb") {
		s.info.Flavor = gomysql.MariaDBFlavor
	}
	mariadb := s.info.Flavor == gomysql.MariaDBFlavor

	v, err := readVars(ctx, s.db)
	if err != nil {
		return err
	}
	if err := v.checkBinlog(s.addr); err != nil {
		return err
	}
	serverID, _ := strconv.ParseUint(v["server_id"], 10, 32)
	s.info.ServerID = uint32(serverID)
	if s.cfg.ServerID == 0 {
		return notReady("server id 0 is not allowed: a replica needs a non-zero id unique in the replication topology (--server-id)")
	}
	if s.cfg.ServerID == s.info.ServerID {
		return notReady("server id %d is the server's own server_id: choose another --server-id", s.cfg.ServerID)
	}
	if mariadb {
		// MariaDB has no server_uuid; file positions are tied to the server
		// id instead (see Info.ServerUUID).
		s.info.ServerUUID = strconv.FormatUint(serverID, 10)
		s.info.GTIDMode = true
	} else {
		s.info.ServerUUID = v["server_uuid"]
		s.info.GTIDMode = strings.ToUpper(v["gtid_mode"]) == "ON"
	}
	s.info.MetadataMode = "information_schema"
	if strings.ToUpper(v["binlog_row_metadata"]) == "FULL" && !s.cfg.ForceSchemaFallback {
		s.info.MetadataMode = "binlog"
	}

	if err := s.checkGrants(ctx, mariadb); err != nil {
		return err
	}
	return s.checkReplicaIDs(ctx)
}

// checkGrants reads SHOW GRANTS for the current user. Grants through roles
// are not expanded, so only a positive finding is trusted: a missing grant
// is reported only when SHOW GRANTS worked and shows none of the ways to
// hold it.
func (s *Stream) checkGrants(ctx context.Context, mariadb bool) error {
	var account string
	if err := s.db.QueryRowContext(ctx, "SELECT CURRENT_USER()").Scan(&account); err != nil {
		return fmt.Errorf("query current user: %w", err)
	}
	user, host, _ := strings.Cut(account, "@")
	grantee := fmt.Sprintf("'%s'@'%s'", user, host)
	rows, err := s.db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		s.log.Warn("cannot read grants; skipping the grant check", zap.Error(err))
		return nil
	}
	defer rows.Close()
	// Global privileges, one name each: substring tests would take
	// "REPLICATION SLAVE ADMIN" for "REPLICATION SLAVE".
	global := map[string]bool{}
	usesRoles := false
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			return fmt.Errorf("read grants: %w", err)
		}
		u := strings.ToUpper(g)
		privs, rest, ok := strings.Cut(strings.TrimPrefix(u, "GRANT "), " ON ")
		if !ok {
			usesRoles = true // GRANT role TO user
			continue
		}
		if !strings.HasPrefix(rest, "*.* ") {
			continue
		}
		for _, p := range strings.Split(privs, ",") {
			global[strings.TrimSpace(p)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read grants: %w", err)
	}
	has := func(privs ...string) bool {
		if global["ALL PRIVILEGES"] || global["ALL"] {
			return true
		}
		for _, p := range privs {
			if global[p] {
				return true
			}
		}
		return false
	}
	var missing []string
	if !has("REPLICATION SLAVE", "REPLICATION REPLICA") {
		missing = append(missing, "REPLICATION SLAVE")
	}
	clientPrivs := []string{"REPLICATION CLIENT"}
	if mariadb {
		clientPrivs = append(clientPrivs, "BINLOG MONITOR") // its name since MariaDB 10.5
	}
	if !has(clientPrivs...) {
		missing = append(missing, "REPLICATION CLIENT")
	}
	hasSelect := has("SELECT")
	if len(missing) == 0 {
		if !hasSelect {
			s.log.Warn("the replication user has no global SELECT: column names and keys of tables it cannot select are missing from information_schema",
				zap.String("fix", "GRANT SELECT ON *.* TO "+grantee))
		}
		return nil
	}
	if usesRoles {
		s.log.Warn("grants may come from roles; cannot verify replication privileges", zap.Strings("missing", missing))
		return nil
	}
	privs := "REPLICATION SLAVE, REPLICATION CLIENT"
	if !hasSelect {
		privs += ", SELECT"
	}
	return notReady("user %s lacks %s: run GRANT %s ON *.* TO %s (SELECT lets cdcout read column names and keys from information_schema)",
		grantee, strings.Join(missing, " and "), privs, grantee)
}

// checkReplicaIDs refuses a server id another connected replica uses: the
// server would disconnect one of the two whenever the other connects.
func (s *Stream) checkReplicaIDs(ctx context.Context) error {
	var rows *sql.Rows
	var err error
	for _, q := range []string{"SHOW REPLICAS", "SHOW SLAVE HOSTS"} {
		if rows, err = s.db.QueryContext(ctx, q); err == nil {
			break
		}
	}
	if err != nil {
		fix := "GRANT REPLICATION SLAVE ON *.* TO the user"
		if s.info.Flavor == gomysql.MariaDBFlavor {
			// MariaDB 10.5.2+ lists replicas only to this privilege.
			fix = "GRANT REPLICATION MASTER ADMIN ON *.* TO the user"
		}
		s.log.Warn("cannot list connected replicas; skipping the server id collision check", zap.Error(err), zap.String("fix", fix))
		return nil
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	idCol, hostCol := -1, -1
	for i, c := range cols {
		switch strings.ToLower(c) {
		case "server_id":
			idCol = i
		case "host":
			hostCol = i
		}
	}
	for rows.Next() {
		vals, err := scanRaw(rows, len(cols))
		if err != nil {
			return err
		}
		if idCol < 0 {
			continue
		}
		id, _ := strconv.ParseUint(string(vals[idCol]), 10, 32)
		if uint32(id) == s.cfg.ServerID {
			host := ""
			if hostCol >= 0 {
				host = string(vals[hostCol])
			}
			return serverIDInUse{notReady("server id %d is already used by a connected replica (host %q): choose another --server-id", s.cfg.ServerID, host)}
		}
	}
	return rows.Err()
}

// loadCollations maps collation ids (as the table map carries them) to
// character set names.
func loadCollations(ctx context.Context, db *sql.DB) (map[uint64]string, error) {
	m := map[uint64]string{63: "binary"}
	rows, err := db.QueryContext(ctx, "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE ID IS NOT NULL AND CHARACTER_SET_NAME IS NOT NULL")
	if err != nil {
		return nil, fmt.Errorf("read collations: %w", err)
	}
	for rows.Next() {
		var id uint64
		var cs string
		if err := rows.Scan(&id, &cs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read collations: %w", err)
		}
		m[id] = cs
	}
	rows.Close()
	// MariaDB 10.10+ lists some collation ids only here.
	if rows, err := db.QueryContext(ctx, "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATION_CHARACTER_SET_APPLICABILITY WHERE ID IS NOT NULL AND CHARACTER_SET_NAME IS NOT NULL"); err == nil {
		for rows.Next() {
			var id uint64
			var cs string
			if rows.Scan(&id, &cs) == nil {
				if _, ok := m[id]; !ok {
					m[id] = cs
				}
			}
		}
		rows.Close()
	}
	return m, nil
}
