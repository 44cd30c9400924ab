package binlog

import (
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestMain stops the package's shared throwaway server after the tests.
func TestMain(m *testing.M) { mysqltest.RunMain(m) }
