package command

// lastN keeps the end of a long log for a failure message.
func lastN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
