package benchload

import (
	"slices"
	"testing"
)

func TestPicked(t *testing.T) {
	names := func(ws []Workload) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.Name)
		}
		return out
	}
	for _, tc := range []struct {
		env  string
		want []string
	}{
		{"", []string{Narrow.Name, Realistic.Name, Wide40.Name}},
		{Wide40.Name + "," + Narrow.Name, []string{Narrow.Name, Wide40.Name}},
		{JSONHeavy.Name, nil},
	} {
		t.Setenv("CDCOUT_BENCH_WORKLOADS", tc.env)
		if got := names(Picked(Narrow, Realistic, Wide40)); !slices.Equal(got, tc.want) {
			t.Errorf("CDCOUT_BENCH_WORKLOADS=%q: Picked = %v, want %v", tc.env, got, tc.want)
		}
	}
}
