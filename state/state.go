// Package state creates and migrates cdcout's own database: the outbox,
// claims, leases, checkpoints, attempts, replicas and backfills tables that
// replicas coordinate through (see docs/ARCHITECTURE.md, "Segments and outbox rows" and
// "High availability").
//
// Migrations are versioned and recorded in schema_migrations. Every replica
// runs Migrate on start, so it takes a server-wide named lock first: replicas
// started together then migrate one after another and the later ones find
// nothing left to do. Each migration's statements are idempotent (IF NOT
// EXISTS), because DDL commits implicitly in MySQL and a crash between a
// CREATE TABLE and the version row must not wedge the next start.
package state

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// lockTimeoutSeconds bounds how long a replica waits for another one's
// migration before giving up with an error.
const lockTimeoutSeconds = 30

// CheckName reports whether schema can be used as cdcout's state database
// name. Only [A-Za-z0-9_] is accepted: the name is spliced into DDL and lock
// names, so anything that would need quoting is refused rather than quoted.
func CheckName(schema string) error {
	if schema == "" {
		return errors.New("state database name is empty")
	}
	if len(schema) > 64 {
		return fmt.Errorf("state database name %q is longer than 64 characters", schema)
	}
	for _, r := range schema {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return fmt.Errorf("state database name %q: only letters, digits and _ are allowed", schema)
		}
	}
	return nil
}

// Table returns the quoted, schema-qualified name of a state table, e.g.
// "`cdcout`.`outbox`".
func Table(schema, name string) string {
	return quoteIdent(schema) + "." + quoteIdent(name)
}

func quoteIdent(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

// lockName is the GET_LOCK name serialising migrations of one state
// database. MySQL limits lock names to 64 characters, so long names are
// hashed.
func lockName(schema string) string {
	n := schema + ".migrate"
	if len(n) <= 64 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return "cdcout.migrate." + hex.EncodeToString(sum[:16])
}

// Migrate creates the state database if it does not exist and applies every
// migration it has not seen yet. It is safe to call from several processes
// at once and to call again.
//
// A database already at a newer version than this binary knows is accepted:
// migrations only add, so an older replica keeps working during a rolling
// upgrade.
func Migrate(ctx context.Context, db *sql.DB, schema string) error {
	if err := CheckName(schema); err != nil {
		return err
	}
	// The named lock belongs to a session, so everything runs on one
	// connection.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: connect: %w", schema, err)
	}
	defer conn.Close()

	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lockName(schema), lockTimeoutSeconds).Scan(&got); err != nil {
		return fmt.Errorf("migrate %s: take migration lock: %w", schema, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("migrate %s: migration lock %q still held by another process after %ds", schema, lockName(schema), lockTimeoutSeconds)
	}
	defer func() {
		// A fresh context: the caller's may be done, and a lock left behind
		// would stall every other replica until this session closes.
		var released sql.NullInt64
		_ = conn.QueryRowContext(context.Background(), "SELECT RELEASE_LOCK(?)", lockName(schema)).Scan(&released)
	}()

	if err := ensureDatabase(ctx, conn, schema); err != nil {
		return err
	}
	if err := CreateMarker(ctx, conn, schema); err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+Table(schema, "schema_migrations")+` (
  version INT NOT NULL PRIMARY KEY,
  applied_at DATETIME(6) NOT NULL DEFAULT NOW(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`); err != nil {
		return fmt.Errorf("migrate %s: create schema_migrations: %w", schema, err)
	}
	applied, err := appliedVersions(ctx, conn, schema)
	if err != nil {
		return err
	}
	for _, m := range migrations {
		if applied[m.version] {
			continue
		}
		for _, stmt := range m.stmts(schema) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migrate %s: version %d (%s): %w", schema, m.version, m.name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT IGNORE INTO "+Table(schema, "schema_migrations")+" (version) VALUES (?)", m.version); err != nil {
			return fmt.Errorf("migrate %s: record version %d: %w", schema, m.version, err)
		}
	}
	return nil
}

// ensureDatabase creates the database only when it is missing, so a user
// without CREATE privilege can still run against a database an operator
// created for it.
func ensureDatabase(ctx context.Context, conn *sql.Conn, schema string) error {
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", schema).Scan(&n); err != nil {
		return fmt.Errorf("migrate %s: look up database: %w", schema, err)
	}
	if n > 0 {
		return nil
	}
	if _, err := conn.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+quoteIdent(schema)+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return fmt.Errorf("migrate %s: create database: %w", schema, err)
	}
	return nil
}

func appliedVersions(ctx context.Context, conn *sql.Conn, schema string) (map[int]bool, error) {
	rows, err := conn.QueryContext(ctx, "SELECT version FROM "+Table(schema, "schema_migrations"))
	if err != nil {
		return nil, fmt.Errorf("migrate %s: read schema_migrations: %w", schema, err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrate %s: read schema_migrations: %w", schema, err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrate %s: read schema_migrations: %w", schema, err)
	}
	return applied, nil
}

// latestVersion is the highest migration version this binary knows.
func latestVersion() int {
	return migrations[len(migrations)-1].version
}
