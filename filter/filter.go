// Package filter evaluates a sink's row filter: a CEL expression
// (github.com/google/cel-go) over a change's op, before, after and source
// that decides whether the sink gets the change.
//
// The expression is parsed and type-checked once, at start-up (Compile),
// so a typo or a type error is a configuration error with its position,
// not a failure on the first matching row. Row images are dynamic (their
// columns are whatever the table has), so what only a row can tell — a
// column that is not there, a comparison of a string with a number — is
// an evaluation error of that row (Eval), which the caller dead-letters.
package filter

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/cel-go/cel"

	"github.com/cdcout/cdcout/canonical"
)

// Filter is a compiled row filter; safe for concurrent use.
type Filter struct {
	expr string
	prg  cel.Program
}

// env declares the variables an expression may use: op ("c", "u", "d",
// "r"), before and after (column → value, null when the change has no
// such image) and source (db, table, gtid, file, pos, server_id, ts_ms,
// instance).
var env = func() *cel.Env {
	e, err := cel.NewEnv(
		cel.Variable("op", cel.StringType),
		cel.Variable("before", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("after", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("source", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		panic(fmt.Sprintf("filter: CEL environment: %v", err)) // static declarations; a test covers them
	}
	return e
}()

// Compile parses and type-checks expr; it must yield a bool.
func Compile(expr string) (*Filter, error) {
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("%s", strings.ReplaceAll(iss.Err().Error(), "\n", " "))
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("the expression yields %s; a filter must yield a bool (true: the sink gets the change)", t)
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, err
	}
	return &Filter{expr: expr, prg: prg}, nil
}

// String is the expression.
func (f *Filter) String() string { return f.expr }

// Eval reports whether ch passes the filter. An error means the filter
// could not decide for this change (a column it names is missing, a type
// mismatch): the change is not to be delivered, and the error says why.
func (f *Filter) Eval(ch *canonical.Change) (bool, error) {
	out, _, err := f.prg.Eval(map[string]any{
		"op":     string(ch.Op),
		"before": image(ch.Before),
		"after":  image(ch.After),
		"source": map[string]any{
			"db": ch.Source.DB, "table": ch.Source.Table, "gtid": ch.Source.GTID, "file": ch.Source.File,
			"pos": int64(ch.Source.Pos), "server_id": int64(ch.Source.ServerID), "ts_ms": ch.Source.TsMs,
			"instance": ch.Source.Instance,
		},
	})
	if err != nil {
		return false, fmt.Errorf("filter %q: %w", f.expr, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("filter %q yielded %v (%s), not a bool", f.expr, out.Value(), out.Type().TypeName())
	}
	return b, nil
}

// image is a row image as CEL values: nil stays null; JSON columns are
// parsed so expressions can reach into them; DECIMALs stay exact strings
// (canonical JSON's representation, docs/canonical-json.md).
func image(r canonical.Row) any {
	if r == nil {
		return nil
	}
	out := make(map[string]any, len(r))
	for k, v := range r {
		out[k] = value(v)
	}
	return out
}

func value(v any) any {
	switch x := v.(type) {
	case canonical.RawJSON:
		var doc any
		if err := json.Unmarshal(x, &doc); err != nil {
			return string(x)
		}
		return doc
	case json.Number:
		return x.String()
	case canonical.Row:
		return image(x)
	case float32:
		return float64(x)
	}
	return v
}
