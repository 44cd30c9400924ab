package backfill

// Read-only backfills write nothing to the source. A chunk's window is
// fenced by binlog positions instead of watermark rows, with the stream's
// help (fence.go):
//
//  1. The runner inserts a fence row (status arming) in the state database.
//  2. The applier of the enqueue leader's stream, between two
//     transactions, opens the chunk's window — from then on it records
//     every key of the table the stream changes — and writes the stream's
//     position S there (armed).
//  3. The runner makes sure every transaction before S is visible to the
//     snapshot it reads: on MySQL it waits until S ⊆ @@GLOBAL.gtid_executed
//     (a GTID enters gtid_executed only after its transaction committed in
//     the engine) and then reads with a plain SELECT, whose read view is
//     created after that; on MariaDB it starts a transaction WITH
//     CONSISTENT SNAPSHOT and checks that the binlog position of that
//     snapshot (binlog_snapshot_file/position, exact by MariaDB's group
//     commit) is at or past S, else starts over.
//  4. It reads the chunk, then reads the server's GTID position H
//     (gtid_executed, gtid_binlog_pos): every transaction the snapshot saw
//     is in H — a committed transaction is in the binary log (two-phase
//     commit writes it there first), and MySQL adds its GTID very shortly
//     after the commit, so H can miss only transactions that committed
//     while the SELECT ran; those reach the consumer after the chunk.
//  5. It stores the rows with H (fenced). When the stream has read H, the
//     applier drops the rows of every key changed since S and puts the rest
//     into the enqueue batch there.
//
// Why that is consistent: a key the stream did not change after S has, in
// the snapshot, the state of the last change before S (visible by 3), which
// the stream delivered before the chunk's rows; a key changed after S is
// left to the stream, whose newer change is (or will be) delivered. This is
// DBLog's argument with the window [S, H] in place of [LOW, HIGH], and the
// same as Debezium's read-only incremental snapshot (GTID sets before and
// after the chunk) and Estuary's position fences; the extra step 3 closes
// the gap between a transaction reaching the binary log and becoming
// visible, which a position read alone cannot see.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cdcout/cdcout/internal/pause"
)

// Fence states in backfill_fences.
const (
	fenceArming = "arming"
	fenceArmed  = "armed"
	fenceFenced = "fenced"
	fenceRetry  = "retry"
)

// position is a binlog position as fences store it (binlog.Position's
// JSON, without importing the stream's package into the runner).
type position struct {
	Flavor  string `json:"flavor"`
	GTIDSet string `json:"gtid_set,omitempty"`
	File    string `json:"file,omitempty"`
	Pos     uint32 `json:"pos,omitempty"`
}

// readOnlyFlavor checks that the source can fence a read-only backfill
// and returns its flavour: MySQL needs GTIDs (the visibility proof reads
// gtid_executed).
func readOnlyFlavor(ctx context.Context, db *sql.DB) (string, error) {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return "", fmt.Errorf("read the source's version: %w", err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return gomysql.MariaDBFlavor, nil
	}
	var mode string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_mode").Scan(&mode); err != nil {
		return "", fmt.Errorf("read the source's gtid_mode: %w", err)
	}
	if !strings.EqualFold(mode, "ON") {
		return "", badInput("read-only backfill on MySQL needs gtid_mode=ON (gtid_mode is %s): its consistency rests on gtid_executed; use a watermark backfill (without read-only) instead", mode)
	}
	return gomysql.MySQLFlavor, nil
}

// chunkReadOnly is chunk for a read-only backfill: arm, read in a snapshot
// that holds everything before the armed position, fence with the
// position after the read.
func (r *Runner) chunkReadOnly(ctx context.Context, f *flight, again bool) (int, error) {
	for {
		armedAt, err := r.arm(ctx, f.no)
		if err != nil {
			return 0, err
		}
		inTx, err := r.visible(ctx, armedAt)
		if err != nil {
			return 0, err
		}
		buf, n, err := r.read(ctx, f, again)
		if inTx {
			_, _ = r.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT")
		}
		if err != nil {
			return 0, err
		}
		high, err := r.serverGTIDs(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 && !again {
			return 0, r.store.dropChunks(ctx, f.no)
		}
		if err := r.store.storeChunk(ctx, f, buf, n); err != nil {
			return 0, err
		}
		ok, err := r.store.fenced(ctx, f.no, high)
		if err != nil {
			return 0, err
		}
		if ok {
			f.at = time.Now()
			return n, nil
		}
		// The window was given up meanwhile (the leader changed): read the
		// range again under a new number.
		if err := r.store.dropChunks(ctx, f.no); err != nil {
			return 0, err
		}
		f.no = r.nextNo()
	}
}

// nextNo is a chunk number no earlier chunk of this run used.
func (r *Runner) nextNo() int64 {
	r.next++
	return r.next - 1
}

// arm asks the stream to open chunk no's window and waits until it has
// (at most the stall time: nothing streams otherwise); it returns the
// stream position the window opened at.
func (r *Runner) arm(ctx context.Context, no int64) (position, error) {
	if err := r.store.askFence(ctx, no, r.spec.Instance, r.spec.Table); err != nil {
		return position{}, err
	}
	deadline := time.Now().Add(r.stall())
	wait := 500 * time.Microsecond
	for {
		status, at, found, err := r.store.fence(ctx, no)
		if err != nil {
			return position{}, err
		}
		if !found {
			if err := r.store.cancelled(ctx); err != nil {
				return position{}, err
			}
			return position{}, fmt.Errorf("backfill %s chunk %d: its fence row disappeared", r.id, no)
		}
		if status == fenceArmed && at.Valid {
			var p position
			if err := json.Unmarshal([]byte(at.String), &p); err != nil {
				return position{}, fmt.Errorf("backfill fence position %q: %w", at.String, err)
			}
			return p, nil
		}
		if time.Now().After(deadline) {
			return position{}, fmt.Errorf("no stream opened the window of read-only backfill %s chunk %d within %s: is a cdcout run of instance %q streaming?",
				r.id, no, r.stall(), r.spec.Instance)
		}
		if err := pause.For(ctx, wait); err != nil {
			return position{}, err
		}
		wait = min(2*wait, 2*time.Millisecond)
	}
}

func (r *Runner) stall() time.Duration {
	if r.Stall > 0 {
		return r.Stall
	}
	return DefaultStall
}

// visible makes the next read see every transaction before at (step 3
// above). inTx: a snapshot transaction is open on r.conn (MariaDB), to be
// committed after the read.
func (r *Runner) visible(ctx context.Context, at position) (inTx bool, err error) {
	deadline := time.Now().Add(r.stall())
	wait := time.Millisecond
	for {
		ok, inTx, err := r.visibleOnce(ctx, at)
		if err != nil || ok {
			return inTx, err
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("backfill %s: the source's snapshots did not reach the stream position %s within %s", r.id, positionText(at), r.stall())
		}
		if err := pause.For(ctx, wait); err != nil {
			return false, err
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

func (r *Runner) visibleOnce(ctx context.Context, at position) (ok, inTx bool, err error) {
	if r.flavor == gomysql.MySQLFlavor {
		if at.GTIDSet == "" {
			return true, false, nil // nothing read yet
		}
		var sub sql.NullInt64
		if err := r.conn.QueryRowContext(ctx, "SELECT GTID_SUBSET(?, @@GLOBAL.gtid_executed)", at.GTIDSet).Scan(&sub); err != nil {
			return false, false, fmt.Errorf("compare GTID sets: %w", err)
		}
		return sub.Int64 == 1, false, nil
	}
	if _, err := r.conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		return false, false, fmt.Errorf("start a snapshot: %w", err)
	}
	file, pos, err := r.snapshotPosition(ctx)
	if err == nil && (at.File == "" || !filePosBefore(file, pos, at.File, at.Pos)) {
		return true, true, nil
	}
	_, _ = r.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	return false, false, err
}

// snapshotPosition is MariaDB's binlog position of the open consistent
// snapshot.
func (r *Runner) snapshotPosition(ctx context.Context) (string, uint32, error) {
	rows, err := r.conn.QueryContext(ctx, "SHOW STATUS LIKE 'binlog_snapshot_%'")
	if err != nil {
		return "", 0, fmt.Errorf("read the snapshot's binlog position: %w", err)
	}
	defer rows.Close()
	var file string
	var pos uint64
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return "", 0, fmt.Errorf("read the snapshot's binlog position: %w", err)
		}
		switch strings.ToLower(name) {
		case "binlog_snapshot_file":
			file = value
		case "binlog_snapshot_position":
			pos, _ = strconv.ParseUint(value, 10, 32)
		}
	}
	if err := rows.Err(); err != nil {
		return "", 0, fmt.Errorf("read the snapshot's binlog position: %w", err)
	}
	if file == "" {
		return "", 0, errors.New("the source reports no binlog_snapshot_file (binary log off?)")
	}
	return file, uint32(pos), nil
}

// serverGTIDs is the server's GTID position now (step 4).
func (r *Runner) serverGTIDs(ctx context.Context) (position, error) {
	q := "SELECT @@GLOBAL.gtid_executed"
	if r.flavor == gomysql.MariaDBFlavor {
		q = "SELECT @@GLOBAL.gtid_binlog_pos"
	}
	p := position{Flavor: r.flavor}
	if err := r.conn.QueryRowContext(ctx, q).Scan(&p.GTIDSet); err != nil {
		return position{}, fmt.Errorf("read the source's GTID position: %w", err)
	}
	p.GTIDSet = strings.ReplaceAll(p.GTIDSet, "\n", "")
	return p, nil
}

// filePosBefore reports whether binlog position (af, ap) is before (bf, bp).
// Binlog file names share a base and end in a zero-padded sequence number,
// which a longer name outgrows.
func filePosBefore(af string, ap uint32, bf string, bp uint32) bool {
	if af != bf {
		if len(af) != len(bf) {
			return len(af) < len(bf)
		}
		return af < bf
	}
	return ap < bp
}

// reached reports whether the stream at pos has read everything up to
// target: by GTID set when both have one, else by file and offset.
func reached(pos, target position) bool {
	if target.GTIDSet != "" && pos.GTIDSet != "" {
		flavor := target.Flavor
		if flavor == "" {
			flavor = pos.Flavor
		}
		have, err1 := gomysql.ParseGTIDSet(flavor, pos.GTIDSet)
		want, err2 := gomysql.ParseGTIDSet(flavor, target.GTIDSet)
		if err1 == nil && err2 == nil {
			return have.Contain(want)
		}
	}
	if target.File == "" {
		return target.GTIDSet == ""
	}
	return pos.File != "" && !filePosBefore(pos.File, pos.Pos, target.File, target.Pos)
}

func positionText(p position) string {
	if p.GTIDSet != "" {
		return p.GTIDSet
	}
	return fmt.Sprintf("%s:%d", p.File, p.Pos)
}
