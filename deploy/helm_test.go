package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// k8sModule carries the Kubernetes API's OpenAPI v3 documents
// (api/openapi-spec/v3), from which the chart's manifests are validated
// offline: kubeconform's default schemas are downloaded from the web.
const k8sModule = "k8s.io/kubernetes@v1.37.2"

// testValues turn on everything the chart can render.
const testValues = `
secrets:
  CDCOUT_DSN_PASSWORD: "p@ss:w/rd"
  HOOK_SECRET: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
  CDCOUT_ADMIN_TOKEN: admin-token-4b1f9c2e7d
config:
  instance: prod
  tables: ["shop.*"]
  sinks:
    - name: hook
      url: https://receiver.example.com/cdc
      secret: ${HOOK_SECRET}
serviceMonitor:
  enabled: true
env:
  - name: GOMEMLIMIT
    value: 400MiB
`

func helm(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, tool(t, "helm"), args...)
}

func writeValues(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(testValues), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// manifest is one rendered object, decoded as far as the checks need.
type manifest struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string
	Metadata   struct{ Name string }
	Data       map[string]string
	Spec       yaml.Node
	raw        map[string]any
}

func render(t *testing.T, args ...string) []manifest {
	t.Helper()
	out := helm(t, append([]string{"template", "cdc", "helm/cdcout"}, args...)...)
	var ms []manifest
	for _, doc := range strings.Split(out, "\n---") {
		var m manifest
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if m.Kind == "" {
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), &m.raw); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	return ms
}

// TestHelmChart lints the chart, renders it with every option on, checks
// the rendered objects against the Kubernetes API schemas with
// kubeconform (strict: unknown fields are errors), and checks what the
// chart promises: two replicas with distinct ids, the probes, config
// from a ConfigMap without secrets, secrets from a Secret.
func TestHelmChart(t *testing.T) {
	values := writeValues(t)
	helm(t, "lint", "--strict", "helm/cdcout", "-f", values)
	ms := render(t, "-f", values)

	kinds := map[string]manifest{}
	for _, m := range ms {
		kinds[m.Kind] = m
	}
	for _, k := range []string{"ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"} {
		if _, ok := kinds[k]; !ok {
			t.Errorf("no %s rendered", k)
		}
	}
	cm := kinds["ConfigMap"].Data["cdcout.yaml"]
	if strings.Contains(cm, "whsec_") || strings.Contains(cm, "p@ss") || !strings.Contains(cm, "${HOOK_SECRET}") {
		t.Errorf("ConfigMap's cdcout.yaml holds a secret or lost its ${HOOK_SECRET} reference:\n%s", cm)
	}
	dep, _ := json.Marshal(kinds["Deployment"].raw)
	for _, want := range []string{
		`"replicas":2`, `"fieldPath":"metadata.name"`, `"name":"CDCOUT_REPLICA_ID"`,
		`"path":"/healthz"`, `"path":"/readyz"`, `"secretRef":{"name":"cdc-cdcout"}`,
		`"value":"cdcout:$(CDCOUT_DSN_PASSWORD)@tcp(mysql:3306)/"`,
	} {
		if !strings.Contains(string(dep), want) {
			t.Errorf("Deployment lacks %s:\n%s", want, dep)
		}
	}
	if strings.Contains(string(dep), "p@ss") || strings.Contains(string(dep), "whsec_") || strings.Contains(string(dep), "admin-token-") {
		t.Errorf("Deployment holds a secret value")
	}
	// The admin token reaches the pods as CDCOUT_ADMIN_TOKEN through the
	// Secret (envFrom), which turns the admin API on.
	if sec, _ := json.Marshal(kinds["Secret"].raw); !strings.Contains(string(sec), `"CDCOUT_ADMIN_TOKEN"`) {
		t.Errorf("Secret lacks CDCOUT_ADMIN_TOKEN:\n%s", sec)
	}

	validate(t, ms)

	// An existing Secret: none rendered, the pods read that one.
	ms = render(t, "--set", "existingSecret=cdc-secrets", "--set", "podDisruptionBudget.enabled=false")
	for _, m := range ms {
		if m.Kind == "Secret" || m.Kind == "PodDisruptionBudget" || m.Kind == "ServiceMonitor" {
			t.Errorf("%s rendered with existingSecret, no PDB and no ServiceMonitor", m.Kind)
		}
		if m.Kind == "Deployment" {
			if b, _ := json.Marshal(m.raw); !strings.Contains(string(b), `"secretRef":{"name":"cdc-secrets"}`) {
				t.Errorf("Deployment does not read existingSecret: %s", b)
			}
		}
	}
	validate(t, ms)
}

// TestHelmChartRefusesMistakes: no password, or a DSN in the ConfigMap,
// stop the render with a message that says what to set.
func TestHelmChartRefusesMistakes(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"", "secrets.CDCOUT_DSN_PASSWORD: the source password is required"},
		{"--set secrets.CDCOUT_DSN_PASSWORD=x --set config.dsn=u:p@tcp(h)/", "config.dsn: set source.*"},
	} {
		args := append([]string{"template", "cdc", "helm/cdcout"}, strings.Fields(tc.args)...)
		out, err := exec.Command(tool(t, "helm"), args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("helm %s: %v, want an error saying %q:\n%s", strings.Join(args, " "), err, tc.want, out)
		}
	}
}

// validate runs kubeconform -strict on the manifests against schemas
// made from the Kubernetes OpenAPI documents, and fails the test unless
// every one is valid. The ServiceMonitor (a Prometheus operator CRD, not
// in them) is checked for its shape here.
func validate(t *testing.T, ms []manifest) {
	t.Helper()
	out, err := kubeconform(t, ms)
	if err != nil || !strings.Contains(out, "Invalid: 0, Errors: 0") {
		t.Fatalf("kubeconform: %v\n%s", err, out)
	}
	t.Logf("kubeconform: %s", strings.TrimSpace(out))
}

func kubeconform(t *testing.T, ms []manifest) (string, error) {
	t.Helper()
	dir := t.TempDir()
	schemas := filepath.Join(dir, "schemas")
	var docs []string
	for _, m := range ms {
		b, err := yaml.Marshal(m.raw)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
		if m.Kind == "ServiceMonitor" {
			if m.APIVersion != "monitoring.coreos.com/v1" || !strings.Contains(string(b), "path: /metrics") || !strings.Contains(string(b), "port: http") {
				t.Errorf("ServiceMonitor does not scrape the http port's /metrics:\n%s", b)
			}
			continue
		}
		writeSchema(t, schemas, m.APIVersion, m.Kind)
	}
	file := filepath.Join(dir, "rendered.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool(t, "kubeconform"), "-strict", "-summary", "-skip", "ServiceMonitor",
		"-schema-location", filepath.Join(schemas, "{{ .ResourceKind }}{{ .KindSuffix }}.json"), file).CombinedOutput()
	return string(out), err
}

// TestSchemasCatchMistakes: the offline schemas reject what the API server
// would (an unknown field, a wrong type), so a valid verdict means
// something.
func TestSchemasCatchMistakes(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}], selectr: {a: b}}\n", "selectr"},
		{"wrong type", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: two, selector: {}, template: {}}\n", "replicas"},
	} {
		var m manifest
		if err := yaml.Unmarshal([]byte(tc.doc), &m); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal([]byte(tc.doc), &m.raw); err != nil {
			t.Fatal(err)
		}
		out, err := kubeconform(t, []manifest{m})
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s: kubeconform accepted it or did not name %q: %v\n%s", tc.name, tc.want, err, out)
		}
	}
}

var specDir string

// k8sSpecDir is the module's OpenAPI v3 directory, downloaded through the
// Go module proxy into the module cache on first use.
func k8sSpecDir(t *testing.T) string {
	t.Helper()
	if specDir != "" {
		return specDir
	}
	cmd := exec.Command("go", "mod", "download", "-json", k8sModule)
	cmd.Dir = t.TempDir() // outside this module: it is no dependency
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", k8sModule, err, out)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v\n%s", k8sModule, err, out)
	}
	specDir = filepath.Join(info.Dir, "api", "openapi-spec", "v3")
	return specDir
}

// writeSchema writes the kubeconform schema of apiVersion/kind into dir,
// named as kubeconform looks it up: <kind>[-<group>]-<version>.json. It
// is the OpenAPI document's components with a root that refers to the
// kind's definition; every object with declared properties gets
// additionalProperties: false, which makes kubeconform -strict reject
// unknown fields (as the API server does).
func writeSchema(t *testing.T, dir, apiVersion, kind string) {
	t.Helper()
	group, version, ok := strings.Cut(apiVersion, "/")
	spec, suffix := "api__"+apiVersion+"_openapi.json", "-"+apiVersion
	if ok {
		spec = "apis__" + group + "__" + version + "_openapi.json"
		suffix = "-" + strings.Split(group, ".")[0] + "-" + version
	} else {
		group, version = "", apiVersion
	}
	b, err := os.ReadFile(filepath.Join(k8sSpecDir(t), spec))
	if err != nil {
		t.Fatalf("no OpenAPI document for %s: %v", apiVersion, err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	def := ""
	for name, s := range doc.Components.Schemas {
		gvks, _ := s["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			g, _ := g.(map[string]any)
			if g["group"] == group && g["version"] == version && g["kind"] == kind {
				def = name
			}
		}
		strict(s)
	}
	if def == "" {
		t.Fatalf("%s %s is not in %s", apiVersion, kind, spec)
	}
	out, err := json.Marshal(map[string]any{
		"allOf":      []any{map[string]any{"$ref": "#/components/schemas/" + def}},
		"components": doc.Components,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s%s.json", strings.ToLower(kind), suffix)
	if err := os.WriteFile(filepath.Join(dir, name), out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// strict closes every object schema with declared properties.
func strict(v any) {
	switch v := v.(type) {
	case map[string]any:
		_, props := v["properties"]
		_, addl := v["additionalProperties"]
		_, open := v["x-kubernetes-preserve-unknown-fields"]
		if props && !addl && !open {
			v["additionalProperties"] = false
		}
		for _, c := range v {
			strict(c)
		}
	case []any:
		for _, c := range v {
			strict(c)
		}
	}
}
