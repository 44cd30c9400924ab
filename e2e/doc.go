// Package e2e holds black-box tests of the real cdcout binary: each test
// package build compiles `cdcout` once (TestMain), then tests start it as a
// child process against a throwaway MariaDB, kill it, restart it and check
// what reached the sinks, the outbox and the dead-letter commands. The
// package has no non-test code beyond this comment; it exists so the
// crash, sink-failure and benchmark suites exercise exactly what operators
// run, signals and process death included.
package e2e
