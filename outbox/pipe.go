package outbox

import "strings"

// PipeName is the name of the pipe of db.table's records for a sink of an
// instance: "<instance>:<db>.<table>:<sink>".
func PipeName(instance, db, table, sink string) string {
	return instance + ":" + db + "." + table + ":" + sink
}

// SplitPipe returns the parts of a pipe name. Instance and sink names
// cannot contain ':' (config validates them), table names might, so the
// first and last ':' delimit; ok is false for a name without both.
func SplitPipe(pipe string) (instance, table, sink string, ok bool) {
	i := strings.IndexByte(pipe, ':')
	j := strings.LastIndexByte(pipe, ':')
	if i < 0 || j <= i {
		return "", "", "", false
	}
	return pipe[:i], pipe[i+1 : j], pipe[j+1:], true
}

// PipeInstance is the instance part of a pipe name: what comes before
// its first ':', or the whole name when it has none.
func PipeInstance(pipe string) string {
	inst, _, _ := strings.Cut(pipe, ":")
	return inst
}

// PipeSink is the sink part of a pipe name: what comes after its last
// ':', or the whole name when it has none.
func PipeSink(pipe string) string {
	return pipe[strings.LastIndexByte(pipe, ':')+1:]
}
