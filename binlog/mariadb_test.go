package binlog

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestUUIDTypeMariaDB: MariaDB 10.7+'s UUID type reaches the binlog as 16
// bytes in the order of the text form's hex digits (for time-based and
// random UUIDs alike; the table map calls the column BINARY(16)), and is
// emitted as a BINARY(16) is: base64 of those bytes, as
// docs/canonical-json.md states.
func TestUUIDTypeMariaDB(t *testing.T) {
	srv := mysqltest.Shared(t)
	mysqltest.OnlyFlavor(t, srv, mysqltest.MariaDB, "the UUID type is MariaDB's")
	db := srv.CreateDB(t, "uuidtype")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, u UUID)")
	c := collect(t, openStream(t, testConfig(t, srv, db)))
	uuids := []string{"123e4567-e89b-12d3-a456-426655440000", "f47ac10b-58cc-4372-a567-0e02b2c3d479"}
	for i, u := range uuids {
		srv.Exec(t, fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d, '%s')", db, i, u))
	}
	for i, ch := range changesOf(c.waitChanges(t, len(uuids))) {
		raw, err := hex.DecodeString(strings.ReplaceAll(uuids[i], "-", ""))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ch.After["u"], raw; !bytes.Equal(got.([]byte), want) {
			t.Errorf("uuid %s came out as % x", uuids[i], got)
		}
	}
}
