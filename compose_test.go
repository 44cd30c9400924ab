package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cdcout/cdcout/config"
)

// TestDockerCompose validates docker-compose.yml with the real docker-compose
// (no engine needed for `config`) and checks what the demo relies on.
func TestDockerCompose(t *testing.T) {
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("docker-compose not installed (.ci/setup installs it)")
		}
		t.Skip("docker-compose not installed")
	}
	out, err := exec.Command(bin, "-f", "docker-compose.yml", "config").CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
	var cfg struct {
		Services map[string]struct {
			Image       string
			Command     []string
			Healthcheck struct{ Test []string }
			// docker-compose v1 prints "127.0.0.1:13306:3306/tcp", v2 a map.
			Ports     []any
			BuildArgs struct {
				Args map[string]string
			} `yaml:"build"`
			DependsOn map[string]struct{ Condition string } `yaml:"depends_on"`
		}
	}
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("parse docker-compose config output: %v", err)
	}
	for _, name := range []string{"mysql", "receiver", "cdcout-1", "cdcout-2"} {
		svc, ok := cfg.Services[name]
		if !ok {
			t.Fatalf("service %q missing", name)
		}
		if len(svc.Healthcheck.Test) == 0 {
			t.Errorf("service %q has no health check", name)
		}
	}
	mysql := cfg.Services["mysql"]
	for _, p := range mysql.Ports {
		hostIP, published := "", ""
		switch p := p.(type) {
		case string:
			parts := strings.Split(p, ":")
			if len(parts) == 3 {
				hostIP, published = parts[0], parts[1]
			}
		case map[string]any:
			hostIP, published = fmt.Sprint(p["host_ip"]), fmt.Sprint(p["published"])
		}
		if published == "3306" || hostIP != "127.0.0.1" {
			t.Errorf("mysql publishes %v: it must not take the host's 3306 nor listen beyond loopback", p)
		}
	}
	for _, name := range []string{"receiver", "cdcout-1", "cdcout-2"} {
		args := cfg.Services[name].BuildArgs.Args
		if _, ok := args["VERSION"]; !ok {
			t.Errorf("%s's image build does not pass VERSION: %v", name, args)
		}
		if _, ok := args["COMMIT"]; !ok {
			t.Errorf("%s's image build does not pass COMMIT: %v", name, args)
		}
	}
	if got, want := mysql.Image, "mysql:8.4"; got != want {
		t.Errorf("mysql image = %q, want %q", got, want)
	}
	for _, flag := range []string{"--log-bin=mysql-bin", "--binlog-format=ROW", "--binlog-row-image=FULL",
		"--binlog-row-metadata=FULL", "--gtid-mode=ON", "--enforce-gtid-consistency=ON"} {
		if !slices.Contains(mysql.Command, flag) {
			t.Errorf("mysql command lacks %s: %v", flag, mysql.Command)
		}
	}
	serverIDs := map[string]bool{}
	for _, name := range []string{"cdcout-1", "cdcout-2"} {
		svc := cfg.Services[name]
		if len(svc.Command) == 0 || svc.Command[0] != "run" {
			t.Errorf("%s command = %v, want cdcout run …", name, svc.Command)
		}
		for _, dep := range []string{"mysql", "receiver"} {
			if got := svc.DependsOn[dep].Condition; got != "service_healthy" {
				t.Errorf("%s depends_on %s condition = %q, want service_healthy", name, dep, got)
			}
		}
		for _, arg := range svc.Command {
			if id, ok := strings.CutPrefix(arg, "--server-id="); ok {
				if serverIDs[id] {
					t.Errorf("replicas share --server-id=%s; each binlog client needs its own", id)
				}
				serverIDs[id] = true
			}
		}
	}
	if len(serverIDs) != 2 {
		t.Errorf("want an explicit, distinct --server-id per replica, got %v", serverIDs)
	}

	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"AS build", "CGO_ENABLED=0", "COPY --from=build", "USER nonroot"} {
		if !strings.Contains(string(dockerfile), want) {
			t.Errorf("Dockerfile lacks %q (multi-stage, static, non-root)", want)
		}
	}
	// The replicas' config file must pass the same validation `cdcout run` does.
	cfg2 := config.Default()
	if err := config.LoadFile(cfg2, "deploy/cdcout.yaml"); err != nil {
		t.Fatalf("deploy/cdcout.yaml: %v", err)
	}
	cfg2.FillSinkDefaults()
	if err := cfg2.Validate(); err != nil {
		t.Fatalf("deploy/cdcout.yaml does not validate: %v", err)
	}
	if len(cfg2.Sinks) != 1 || cfg2.Sinks[0].Secret.Value() == "" {
		t.Errorf("deploy/cdcout.yaml should define the signed webhook sink, got %+v", cfg2.Sinks)
	}

	initSQL, err := os.ReadFile("deploy/mysql-init/01-cdcout.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(initSQL), "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*") {
		t.Error("init script does not grant the replication privileges")
	}
	if strings.Contains(string(initSQL), "GRANT ALL PRIVILEGES ON *.*") {
		t.Error("init script grants ALL on *.*; the cdcout user must be least-privilege")
	}
}
