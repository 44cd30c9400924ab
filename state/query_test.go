package state

import "testing"

func TestEscapeLike(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"main", "main"},
		{"a_b%c", `a\_b\%c`},
		{`back\slash`, `back\\slash`},
	} {
		if got := EscapeLike(c.in); got != c.want {
			t.Errorf("EscapeLike(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got, want := LikePrefix("x_y:"), `x\_y:%`; got != want {
		t.Errorf("LikePrefix = %q, want %q", got, want)
	}
}
