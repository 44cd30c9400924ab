package main

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/command"
	"github.com/cdcout/cdcout/config"
)

// configRow is a row of the README's configuration table:
// | `--flag` / `yaml_key` | default | meaning |
var configRow = regexp.MustCompile("(?m)^\\| `--([a-z-]+)(?: [^`]*)?`(?: / `([a-z_]+)`)? \\|")

// TestREADMEConfigurationReference keeps the README's configuration table
// in step with what the binary accepts: every row names a real flag of
// cdcout run, whose environment variable and YAML key (the row's) are
// accepted too; every setting has a row; the command table lists every
// command.
func TestREADMEConfigurationReference(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	app := command.NewApp(nil, nil, nil)
	runFlags := map[string]bool{}
	for _, c := range app.Commands {
		if c.Name != "run" {
			continue
		}
		for _, f := range c.Flags {
			for _, n := range f.Names() {
				runFlags[n] = true
			}
		}
	}
	settings := map[string]bool{}
	for _, n := range config.SettingNames() {
		settings[n] = true
	}
	yamlKeys := map[string]bool{}
	ct := reflect.TypeFor[config.Config]()
	for i := range ct.NumField() {
		if k, _, _ := strings.Cut(ct.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
			yamlKeys[k] = true
		}
	}
	rows := configRow.FindAllStringSubmatch(text, -1)
	if len(rows) < 10 {
		t.Fatalf("found %d rows of the configuration table; did its format change?", len(rows))
	}
	documented := map[string]bool{}
	for _, r := range rows {
		flag, key := r[1], r[2]
		documented[flag] = true
		if !runFlags[flag] {
			t.Errorf("README documents --%s, which cdcout run does not define", flag)
		}
		if !settings[flag] {
			t.Errorf("README documents --%s, which has no environment variable %s", flag, config.EnvName(flag))
		}
		if key == "" {
			continue
		}
		if want := strings.ReplaceAll(flag, "-", "_"); key != want && !(flag == "sink" && key == "sinks") {
			t.Errorf("README gives --%s the YAML key %s, want %s", flag, key, want)
		}
		if !yamlKeys[key] {
			t.Errorf("README documents the YAML key %s, which the config file does not accept", key)
		}
	}
	for n := range settings {
		if !documented[n] {
			t.Errorf("README's configuration table has no row for --%s", n)
		}
		if !runFlags[n] {
			t.Errorf("setting %s (%s) is not a flag of cdcout run", n, config.EnvName(n))
		}
	}
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
