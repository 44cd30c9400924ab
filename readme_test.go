package main

import (
	"os"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/command"
	"github.com/cdcout/cdcout/config"
)

// TestREADMEConfigurationReference keeps the README's configuration table
// in step with the settings the code accepts, and its command table with
// the commands that exist.
func TestREADMEConfigurationReference(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	for _, name := range config.SettingNames() {
		if !strings.Contains(text, "`--"+name) {
			t.Errorf("README does not document --%s", name)
		}
	}
	app := command.NewApp(nil, nil, nil)
	for _, c := range app.Commands {
		if !strings.Contains(text, "`cdcout "+c.Name) {
			t.Errorf("README does not document `cdcout %s`", c.Name)
		}
	}
	for _, cmd := range []string{"make demo", "make test"} {
		if !strings.Contains(text, cmd) {
			t.Errorf("README lacks the %q command", cmd)
		}
	}
}
