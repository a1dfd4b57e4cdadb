package deploy

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The tests run in deploy/; the agent's sources are one level up.
const (
	agentSourceFile = "../cmd/shoal/agent.go"
	rootSourceFile  = "../cmd/shoal/main.go"
	configSourceGo  = "../node/config/config.go"
)

// ---------------------------------------------------------------------------
// What the agent accepts, read from its source so the artifacts cannot drift
// from it unnoticed.

// agentFacts are the agent's flags (with their pflag type), the SHOAL_*
// variables it reads and its default drain timeout.
type agentFacts struct {
	flags        map[string]string // flag name → pflag kind (String, Bool, Int, Duration, StringArray, ...)
	envs         map[string]string // SHOAL_* variable → the flag it sets ("" when read directly)
	drainDefault time.Duration
}

var (
	flagDefRE     = regexp.MustCompile(`\.(\w+?)Var(?:P)?\(\s*[^,]+,\s*"([a-z][a-z0-9-]*)"`)
	rootFlagDefRE = regexp.MustCompile(`PersistentFlags\(\)\.(\w+?)Var(?:P)?\(\s*[^,]+,\s*"([a-z][a-z0-9-]*)"`)
	mergeFieldRE  = regexp.MustCompile(`\{"([a-z][a-z0-9-]*)",`)
	getenvRE      = regexp.MustCompile(`os\.Getenv\("(SHOAL_[A-Z0-9_]+)"\)`)
	drainDefRE    = regexp.MustCompile(`"drain-timeout",\s*(\d+)\s*\*\s*time\.Second`)
)

func readAgentFacts(t *testing.T) agentFacts {
	t.Helper()
	agent, err := os.ReadFile(agentSourceFile)
	if err != nil {
		t.Fatalf("the agent's flags are read from its source: %v", err)
	}
	root, err := os.ReadFile(rootSourceFile)
	if err != nil {
		t.Fatalf("the CLI's global flags are read from its source: %v", err)
	}
	f, err := parseAgentFacts(string(agent), string(root))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// parseAgentFacts reads the flag definitions of `shoal agent` (and the
// CLI's persistent flags) and the environment variables mergeAgentFlags
// and the command read.
func parseAgentFacts(agentSrc, rootSrc string) (agentFacts, error) {
	f := agentFacts{flags: map[string]string{}, envs: map[string]string{}, drainDefault: 30 * time.Second}
	for _, m := range flagDefRE.FindAllStringSubmatch(agentSrc, -1) {
		f.flags[m[2]] = m[1]
	}
	for _, m := range rootFlagDefRE.FindAllStringSubmatch(rootSrc, -1) {
		f.flags[m[2]] = m[1]
	}
	for _, want := range []string{"server", "bootstrap-expect", "join", "data-dir", "name", "token", "memory-limit"} {
		if _, ok := f.flags[want]; !ok {
			return f, fmt.Errorf("found no --%s flag in %s: has the agent's flag code moved? (the deploy tests read it)", want, agentSourceFile)
		}
	}
	start := strings.Index(agentSrc, "func mergeAgentFlags(")
	if start < 0 {
		return f, fmt.Errorf("no mergeAgentFlags in %s: the deploy tests read which flags have SHOAL_* variables from it", agentSourceFile)
	}
	body := agentSrc[start:]
	if end := strings.Index(body, "\n}\n"); end >= 0 {
		body = body[:end]
	}
	for _, m := range mergeFieldRE.FindAllStringSubmatch(body, -1) {
		if _, ok := f.flags[m[1]]; !ok {
			continue
		}
		env := "SHOAL_" + strings.ToUpper(strings.ReplaceAll(m[1], "-", "_"))
		if m[1] == "token" {
			env = "SHOAL_AGENT_TOKEN" // SHOAL_TOKEN is the CLI's API key
			if !strings.Contains(body, `"SHOAL_AGENT_TOKEN"`) {
				return f, errors.New("mergeAgentFlags no longer names SHOAL_AGENT_TOKEN: update the deploy tests and artifacts")
			}
		}
		f.envs[env] = m[1]
	}
	for _, m := range getenvRE.FindAllStringSubmatch(agentSrc, -1) {
		if _, ok := f.envs[m[1]]; !ok {
			f.envs[m[1]] = strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(m[1], "SHOAL_"), "_", "-"))
		}
	}
	if len(f.envs) == 0 {
		return f, fmt.Errorf("found no SHOAL_* variables in %s", agentSourceFile)
	}
	if m := drainDefRE.FindStringSubmatch(agentSrc); m != nil {
		n, _ := strconv.Atoi(m[1])
		f.drainDefault = time.Duration(n) * time.Second
	}
	return f, nil
}

func TestParseAgentFacts(t *testing.T) {
	f := readAgentFacts(t)
	for flag, kind := range map[string]string{"server": "Bool", "join": "StringArray", "bootstrap-expect": "Int", "log-level": "String"} {
		if f.flags[flag] != kind {
			t.Errorf("--%s: parsed kind %q, want %q", flag, f.flags[flag], kind)
		}
	}
	for _, env := range []string{"SHOAL_AGENT_TOKEN", "SHOAL_JOIN", "SHOAL_BOOTSTRAP_EXPECT", "SHOAL_MEMORY_LIMIT"} {
		if _, ok := f.envs[env]; !ok {
			t.Errorf("%s is not among the variables found in the agent's source: %v", env, f.envs)
		}
	}
	if _, ok := f.envs["SHOAL_TOKEN"]; ok {
		t.Errorf("SHOAL_TOKEN is the CLI's API key, not an agent variable")
	}
	if _, err := parseAgentFacts("package main", ""); err == nil {
		t.Errorf("a source without the agent's flags was accepted")
	}
}

// shoal's sizes: 512MiB, 6GiB, 1.5G, 100MB (as shoal agent --memory-limit
// reads them: binary units for KiB..TiB and K..T, decimal for KB..TB).
func parseShoalSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
		{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1},
	} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a size such as 6GiB", s)
	}
	return uint64(v * mult), nil
}

func TestParseShoalSize(t *testing.T) {
	for in, want := range map[string]uint64{"6GiB": 6 << 30, "512MiB": 512 << 20, "1.5G": 3 << 29, "100MB": 100e6, "7": 7} {
		if got, err := parseShoalSize(in); err != nil || got != want {
			t.Errorf("parseShoalSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1GiB", "six"} {
		if _, err := parseShoalSize(bad); err == nil {
			t.Errorf("parseShoalSize(%q) accepted", bad)
		}
	}
}

// ---------------------------------------------------------------------------
// Kubernetes

type manifests struct {
	files        []string // YAML files of the directory, kustomization.yaml aside
	kustomized   []string // its resources
	statefulSets []*appsv1.StatefulSet
	services     map[string]*corev1.Service
	secrets      map[string]*corev1.Secret
	configMaps   map[string]*corev1.ConfigMap
	pdbs         []*policyv1.PodDisruptionBudget
}

func (m *manifests) objects() []metav1.Object {
	var objs []metav1.Object
	for _, s := range m.statefulSets {
		objs = append(objs, s)
	}
	for _, k := range sortedKeys(m.services) {
		objs = append(objs, m.services[k])
	}
	for _, k := range sortedKeys(m.secrets) {
		objs = append(objs, m.secrets[k])
	}
	for _, k := range sortedKeys(m.configMaps) {
		objs = append(objs, m.configMaps[k])
	}
	for _, p := range m.pdbs {
		objs = append(objs, p)
	}
	return objs
}

func (m *manifests) clone() *manifests {
	c := &manifests{
		files: slices.Clone(m.files), kustomized: slices.Clone(m.kustomized),
		services: map[string]*corev1.Service{}, secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{},
	}
	for _, s := range m.statefulSets {
		c.statefulSets = append(c.statefulSets, s.DeepCopy())
	}
	for k, v := range m.services {
		c.services[k] = v.DeepCopy()
	}
	for k, v := range m.secrets {
		c.secrets[k] = v.DeepCopy()
	}
	for k, v := range m.configMaps {
		c.configMaps[k] = v.DeepCopy()
	}
	for _, p := range m.pdbs {
		c.pdbs = append(c.pdbs, p.DeepCopy())
	}
	return c
}

var (
	docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(?:#.*)?$`)
	varRefRE     = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	wholeVarRE   = regexp.MustCompile(`^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$`)
)

// splitYAML cuts a multi-document file on `---` lines and drops documents
// that hold nothing but comments.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range docSeparator.Split(string(b), -1) {
		empty := true
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// decodeObject decodes one YAML document into its typed Kubernetes object,
// rejecting fields the type does not have.
func decodeObject(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	default:
		return nil, fmt.Errorf("apiVersion %q kind %q: not a kind these manifests use", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

func loadManifests(dir string) (*manifests, error) {
	m := &manifests{services: map[string]*corev1.Service{}, secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || (!strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if name == "kustomization.yaml" {
			var k kustomization
			if err := yaml.UnmarshalStrict(b, &k); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			} else if k.Kind != "Kustomization" || !strings.HasPrefix(k.APIVersion, "kustomize.config.k8s.io/") {
				errs = append(errs, fmt.Errorf("%s: apiVersion %q kind %q, want a kustomize.config.k8s.io Kustomization", name, k.APIVersion, k.Kind))
			}
			m.kustomized = k.Resources
			continue
		}
		m.files = append(m.files, name)
		docs := splitYAML(b)
		if len(docs) == 0 {
			errs = append(errs, fmt.Errorf("%s: no YAML document", name))
		}
		for i, doc := range docs {
			obj, err := decodeObject(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s document %d: %w", name, i+1, err))
				continue
			}
			dup := false
			switch o := obj.(type) {
			case *appsv1.StatefulSet:
				m.statefulSets = append(m.statefulSets, o)
			case *corev1.Service:
				dup = m.services[o.Name] != nil
				m.services[o.Name] = o
			case *corev1.Secret:
				dup = m.secrets[o.Name] != nil
				m.secrets[o.Name] = o
			case *corev1.ConfigMap:
				dup = m.configMaps[o.Name] != nil
				m.configMaps[o.Name] = o
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			}
			if dup {
				errs = append(errs, fmt.Errorf("%s document %d: a second object of its kind named %q", name, i+1, obj.(metav1.Object).GetName()))
			}
		}
	}
	return m, errors.Join(errs...)
}

// agentContainer is the container that runs shoal agent.
func agentContainer(sts *appsv1.StatefulSet) *corev1.Container {
	cs := sts.Spec.Template.Spec.Containers
	for i := range cs {
		if cs[i].Name == "shoal" {
			return &cs[i]
		}
	}
	if len(cs) > 0 {
		return &cs[0]
	}
	return nil
}

// agentSettings resolves the agent's settings in a container the way the
// agent would: a flag on the command line, else its SHOAL_* variable (env
// before envFrom, as Kubernetes sets them).
type agentSettings struct {
	flags map[string][]string
	env   map[string]corev1.EnvVar // container env by name
	from  map[string]string        // literal values from envFrom ConfigMaps
	cms   map[string]*corev1.ConfigMap
	facts agentFacts
}

func parseAgentCommand(argv []string, facts agentFacts) (map[string][]string, error) {
	if len(argv) < 2 || argv[0] != "/shoal" || argv[1] != "agent" {
		return nil, fmt.Errorf("command %q: want /shoal agent ... (the image is FROM scratch: the binary is /shoal and there is no shell)", argv)
	}
	flags := map[string][]string{}
	for i := 2; i < len(argv); i++ {
		a := argv[i]
		if !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("argument %q: shoal agent takes no positional arguments", a)
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		kind, ok := facts.flags[name]
		if !ok {
			return nil, fmt.Errorf("--%s is not a flag of shoal agent", name)
		}
		if !hasVal {
			if kind == "Bool" {
				val = "true"
			} else if i+1 < len(argv) {
				i++
				val = argv[i]
			} else {
				return nil, fmt.Errorf("--%s has no value", name)
			}
		}
		flags[name] = append(flags[name], val)
	}
	return flags, nil
}

func (s *agentSettings) envName(flag string) string {
	for env, f := range s.facts.envs {
		if f == flag {
			return env
		}
	}
	return ""
}

// get gives the values of a setting and where they came from ("" when unset).
func (s *agentSettings) get(flag string) ([]string, string) {
	if v, ok := s.flags[flag]; ok {
		return v, "--" + flag
	}
	env := s.envName(flag)
	if env == "" {
		return nil, ""
	}
	if e, ok := s.env[env]; ok {
		if e.ValueFrom == nil {
			return splitEnvList(flag, e.Value), env
		}
		if ref := e.ValueFrom.ConfigMapKeyRef; ref != nil && s.cms[ref.Name] != nil {
			if v, ok := s.cms[ref.Name].Data[ref.Key]; ok {
				return splitEnvList(flag, v), env
			}
		}
		return nil, ""
	}
	if v, ok := s.from[env]; ok {
		return splitEnvList(flag, v), env
	}
	return nil, ""
}

func splitEnvList(flag, v string) []string {
	if flag == "join" {
		return strings.Split(v, ",")
	}
	return []string{v}
}

func (s *agentSettings) one(flag string) (string, string) {
	v, src := s.get(flag)
	if len(v) == 0 {
		return "", src
	}
	return v[len(v)-1], src
}

// containerPort resolves a Service target port or a probe port against the
// container's ports.
func containerPort(c *corev1.Container, p intstr.IntOrString, proto corev1.Protocol) (int32, bool) {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, cp := range c.Ports {
		cproto := cp.Protocol
		if cproto == "" {
			cproto = corev1.ProtocolTCP
		}
		if cproto != proto {
			continue
		}
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// targetPort is where a Service port sends traffic (its own number when
// targetPort is unset).
func targetPort(p corev1.ServicePort) intstr.IntOrString {
	if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0 {
		return intstr.FromInt32(p.Port)
	}
	return p.TargetPort
}

func intSetting(s *agentSettings, flag string, def int) (int, error) {
	v, src := s.one(flag)
	if src == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a number", src, v)
	}
	return n, nil
}

// checkManifests returns every broken invariant of the Kubernetes
// manifests: what the agent needs from them and what they need from each
// other.
func checkManifests(m *manifests, facts agentFacts) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	// kustomization.yaml lists every manifest once.
	sort.Strings(m.files)
	listed := slices.Clone(m.kustomized)
	sort.Strings(listed)
	if !slices.Equal(listed, m.files) {
		fail("kustomization.yaml resources %v, want the directory's manifests %v", m.kustomized, m.files)
	}

	if len(m.statefulSets) != 1 {
		fail("%d StatefulSets, want 1", len(m.statefulSets))
		return errs
	}
	sts := m.statefulSets[0]
	pod := &sts.Spec.Template
	podLabels := labels.Set(pod.Labels)
	c := agentContainer(sts)
	if c == nil {
		fail("StatefulSet %s has no container", sts.Name)
		return errs
	}
	for _, o := range m.objects() {
		if o.GetNamespace() != "" {
			fail("%s sets namespace %q: the manifests are namespace-agnostic", o.GetName(), o.GetNamespace())
		}
	}

	// The pods the StatefulSet owns.
	if sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(podLabels) {
		fail("StatefulSet selector %v does not match its pod labels %v (%v)", sts.Spec.Selector, pod.Labels, err)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		fail("podManagementPolicy %q, want Parallel: the servers wait for each other to bootstrap, OrderedReady would wait for shoal-0 to be ready first", sts.Spec.PodManagementPolicy)
	}
	if sts.Spec.Replicas == nil {
		fail("StatefulSet %s does not set replicas", sts.Name)
		return errs
	}
	replicas := int(*sts.Spec.Replicas)

	// The agent's command line.
	flags, err := parseAgentCommand(append(slices.Clone(c.Command), c.Args...), facts)
	if err != nil {
		fail("container %s: %v", c.Name, err)
		return errs
	}
	s := &agentSettings{flags: flags, env: map[string]corev1.EnvVar{}, from: map[string]string{}, cms: m.configMaps, facts: facts}
	for _, e := range c.Env {
		s.env[e.Name] = e
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			cm := m.configMaps[ef.ConfigMapRef.Name]
			if cm == nil {
				if ef.ConfigMapRef.Optional == nil || !*ef.ConfigMapRef.Optional {
					fail("envFrom ConfigMap %q is not among the manifests", ef.ConfigMapRef.Name)
				}
				continue
			}
			for k, v := range cm.Data {
				name := ef.Prefix + k
				if _, ok := facts.envs[name]; !ok {
					fail("ConfigMap %s key %s: not a variable shoal agent reads (known: %v)", cm.Name, name, sortedKeys(facts.envs))
				}
				s.from[name] = v
			}
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "SHOAL_") {
			if _, ok := facts.envs[e.Name]; !ok {
				fail("env %s: not a variable shoal agent reads", e.Name)
			}
		}
	}
	if v, _ := s.one("server"); v != "true" {
		fail("the agent does not run with --server: the StatefulSet's pods are the Raft servers")
	}

	// Every $(VAR) in the command is defined in env.
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		for _, ref := range varRefRE.FindAllStringSubmatch(a, -1) {
			if _, ok := s.env[ref[1]]; !ok {
				fail("argument %q refers to $(%s), which the container's env does not define", a, ref[1])
			}
		}
	}
	// fieldRef is the downward API field a value "$(VAR)" takes.
	fieldRef := func(v string) string {
		m := wholeVarRE.FindStringSubmatch(v)
		if m == nil {
			return ""
		}
		if e, ok := s.env[m[1]]; ok && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
		return ""
	}
	if v, _ := s.one("name"); fieldRef(v) != "metadata.name" {
		fail("--name %q: want $(POD_NAME) with POD_NAME from the downward API (metadata.name), a stable name per pod", v)
	}
	if v, src := s.one("advertise"); src != "" && fieldRef(v) != "status.podIP" {
		fail("--advertise %q: want $(POD_IP) with POD_IP from the downward API (status.podIP)", v)
	}

	// Replicas and bootstrap-expect.
	if be, err := intSetting(s, "bootstrap-expect", 0); err != nil {
		fail("%v", err)
	} else if be != replicas {
		fail("replicas %d but --bootstrap-expect %d: the servers that bootstrap together are the StatefulSet's pods", replicas, be)
	}

	// Ports.
	gossipPort, err1 := intSetting(s, "gossip-port", 7946)
	quicPort, err2 := intSetting(s, "quic-port", 7947)
	httpPort, err3 := intSetting(s, "http-port", 7948)
	if err := errors.Join(err1, err2, err3); err != nil {
		fail("%v", err)
	}
	need := []struct {
		port  int
		proto corev1.Protocol
		what  string
	}{{gossipPort, corev1.ProtocolTCP, "gossip"}, {gossipPort, corev1.ProtocolUDP, "gossip"}, {quicPort, corev1.ProtocolUDP, "QUIC"}, {quicPort, corev1.ProtocolTCP, "direct collectives"}, {httpPort, corev1.ProtocolTCP, "API"}}
	for _, n := range need {
		if _, ok := containerPort(c, intstr.FromInt32(int32(n.port)), n.proto); !ok {
			fail("container does not declare %s port %d/%s", n.what, n.port, n.proto)
		}
	}

	// Join addresses: the headless service's name of every pod, once.
	joins, _ := s.get("join")
	want := map[string]int{}
	for i := range replicas {
		want[fmt.Sprintf("%s-%d.%s", sts.Name, i, sts.Spec.ServiceName)] = 0
	}
	for _, j := range joins {
		host, port := j, ""
		if h, p, err := net.SplitHostPort(j); err == nil {
			host, port = h, p
		}
		if port != "" && port != strconv.Itoa(quicPort) {
			fail("--join %s: port %s is not the QUIC port %d", j, port, quicPort)
		}
		matched := false
		for w := range want {
			if host == w || strings.HasPrefix(host, w+".") { // optionally .NAMESPACE[.svc[.cluster.local]]
				want[w]++
				matched = true
			}
		}
		if !matched {
			fail("--join %s is not the DNS name of a pod of the StatefulSet (<name>-<i>.%s)", j, sts.Spec.ServiceName)
		}
	}
	for w, n := range want {
		if n != 1 {
			fail("--join lists %s %d times, want once (every one of the %d replicas, exactly)", w, n, replicas)
		}
	}

	// The headless service.
	hs := m.services[sts.Spec.ServiceName]
	if hs == nil {
		fail("serviceName %q is not a Service of the manifests", sts.Spec.ServiceName)
	} else {
		if hs.Spec.ClusterIP != corev1.ClusterIPNone {
			fail("Service %s: clusterIP %q, want None (headless: per-pod DNS names)", hs.Name, hs.Spec.ClusterIP)
		}
		if !hs.Spec.PublishNotReadyAddresses {
			fail("Service %s: publishNotReadyAddresses is false: the pods become ready only after they have joined each other by these names", hs.Name)
		}
		for _, n := range need {
			found := false
			for _, p := range hs.Spec.Ports {
				proto := p.Protocol
				if proto == "" {
					proto = corev1.ProtocolTCP
				}
				if int(p.Port) == n.port && proto == n.proto {
					found = true
				}
			}
			if !found {
				fail("Service %s does not expose %s port %d/%s", hs.Name, n.what, n.port, n.proto)
			}
		}
	}
	// Every Service selects the pods and reaches a declared container port.
	for _, svc := range m.services {
		if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			fail("Service %s selector %v does not select the pods (labels %v)", svc.Name, svc.Spec.Selector, pod.Labels)
		}
		for _, p := range svc.Spec.Ports {
			tp := targetPort(p)
			if _, ok := containerPort(c, tp, p.Protocol); !ok {
				fail("Service %s port %s: target port %s/%s is not a port of the container", svc.Name, p.Name, tp.String(), p.Protocol)
			}
		}
	}
	client := m.services[sts.Name]
	if client == nil {
		fail("no client Service %q", sts.Name)
	} else {
		ok := false
		for _, p := range client.Spec.Ports {
			if port, found := containerPort(c, targetPort(p), p.Protocol); found && int(port) == httpPort && p.Port == int32(httpPort) {
				ok = true
			}
		}
		if !ok {
			fail("Service %s does not forward %d to the API port %d", client.Name, httpPort, httpPort)
		}
	}

	// Probes on the API: HTTPS unless the agent runs --insecure-http.
	scheme := corev1.URISchemeHTTPS
	if v, _ := s.one("insecure-http"); v == "true" {
		scheme = corev1.URISchemeHTTP
	}
	if v, _ := s.one("bind"); v != "" {
		if ip := net.ParseIP(v); ip != nil && ip.IsLoopback() {
			fail("--bind %s: the kubelet's probes and the other pods cannot reach a loopback address", v)
		}
	}
	checkProbe := func(what string, p *corev1.Probe, ready bool) {
		if p == nil {
			fail("%s probe missing", what)
			return
		}
		if p.HTTPGet == nil {
			fail("%s probe is not an HTTP GET", what)
			return
		}
		g := p.HTTPGet
		if g.Scheme != scheme {
			fail("%s probe scheme %q, want %s (the API serves HTTPS with the cluster's CA)", what, g.Scheme, scheme)
		}
		if port, ok := containerPort(c, g.Port, corev1.ProtocolTCP); !ok || int(port) != httpPort {
			fail("%s probe port %s is not the API port %d", what, g.Port.String(), httpPort)
		}
		u, err := url.Parse(g.Path)
		if err != nil || u.Path != "/v1/health" {
			fail("%s probe path %q, want /v1/health", what, g.Path)
			return
		}
		if got := u.Query().Get("ready"); ready && got != "1" {
			fail("%s probe path %q, want /v1/health?ready=1 (200 once joined, a leader known and serving)", what, g.Path)
		} else if !ready && u.Query().Has("ready") {
			fail("%s probe path %q asks for readiness: a lost quorum would restart every pod", what, g.Path)
		}
	}
	checkProbe("readiness", c.ReadinessProbe, true)
	checkProbe("liveness", c.LivenessProbe, false)
	if c.StartupProbe != nil {
		checkProbe("startup", c.StartupProbe, false)
	}

	// Memory: the request covers what the agent offers to models.
	if v, src := s.one("memory-limit"); src == "" {
		fail("no --memory-limit / SHOAL_MEMORY_LIMIT: the agent would offer the host's free memory, not the pod's")
	} else if limit, err := parseShoalSize(v); err != nil {
		fail("%s: %v", src, err)
	} else {
		req, hasReq := c.Resources.Requests[corev1.ResourceMemory]
		if !hasReq {
			fail("the container requests no memory; it offers %s to models", v)
		} else if req.Value() < int64(limit) {
			fail("memory request %s is below %s %s (%d bytes)", req.String(), src, v, limit)
		}
		if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			if lim.Value() <= int64(limit) {
				fail("memory limit %s is not above %s %s: the agent itself needs memory beyond what it offers", lim.String(), src, v)
			}
			if hasReq && lim.Cmp(req) < 0 {
				fail("memory limit %s is below the request %s", lim.String(), req.String())
			}
		}
	}

	// Stopping: the grace period outlasts the drain.
	drain := facts.drainDefault
	if v, src := s.one("drain-timeout"); src != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fail("%s %q: %v", src, v, err)
		}
		drain = d
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain {
		fail("terminationGracePeriodSeconds %v is not above the drain timeout %s: the kubelet would SIGKILL a draining agent", derefInt64(g), drain)
	}

	// The bootstrap secret.
	if _, ok := s.flags["token"]; ok {
		fail("--token on the command line: the secret would show in the pod spec; take it from the Secret")
	}
	tokenFrom := ""
	if e, ok := s.env["SHOAL_AGENT_TOKEN"]; ok {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			fail("env SHOAL_AGENT_TOKEN is not taken from a Secret (valueFrom.secretKeyRef)")
		} else {
			ref := e.ValueFrom.SecretKeyRef
			tokenFrom = ref.Name + "/" + ref.Key
			checkToken(m.secrets[ref.Name], ref.Name, ref.Key, fail)
		}
	} else {
		for _, ef := range c.EnvFrom {
			key, ok := strings.CutPrefix("SHOAL_AGENT_TOKEN", ef.Prefix)
			if ef.SecretRef != nil && ok && secretHas(m.secrets[ef.SecretRef.Name], key) {
				tokenFrom = ef.SecretRef.Name
				checkToken(m.secrets[ef.SecretRef.Name], ef.SecretRef.Name, key, fail)
			}
		}
	}
	if tokenFrom == "" {
		fail("the container does not get SHOAL_AGENT_TOKEN from a Secret: --bootstrap-expect %d needs the shared secret", replicas)
	}
	if m.secrets["shoal-secrets"] == nil {
		fail("no Secret shoal-secrets")
	}
	if m.configMaps["shoal-config"] == nil {
		fail("no ConfigMap shoal-config")
	}
	for _, cm := range m.configMaps {
		for k, v := range cm.Data {
			if strings.Contains(k, "TOKEN") || strings.Contains(strings.ToLower(v), "bearer") {
				fail("ConfigMap %s key %s looks like a secret: keep secrets in the Secret", cm.Name, k)
			}
		}
	}

	// Data on the claim.
	dataDir, _ := s.one("data-dir")
	onClaim := false
	for _, vm := range c.VolumeMounts {
		if path.Clean(vm.MountPath) != path.Clean(dataDir) {
			continue
		}
		for _, vct := range sts.Spec.VolumeClaimTemplates {
			if vct.Name == vm.Name {
				onClaim = true
			}
		}
	}
	if dataDir == "" || !onClaim {
		fail("--data-dir %q is not a volume mount of a volumeClaimTemplate: the node's identity and Raft log would not survive a restart", dataDir)
	}

	// Security.
	ps, cs := pod.Spec.SecurityContext, c.SecurityContext
	if ps == nil {
		ps = &corev1.PodSecurityContext{}
	}
	if cs == nil {
		cs = &corev1.SecurityContext{}
	}
	runAsNonRoot, runAsUser := ps.RunAsNonRoot, ps.RunAsUser
	if cs.RunAsNonRoot != nil {
		runAsNonRoot = cs.RunAsNonRoot
	}
	if cs.RunAsUser != nil {
		runAsUser = cs.RunAsUser
	}
	if runAsNonRoot == nil || !*runAsNonRoot {
		fail("runAsNonRoot is not set")
	}
	if runAsUser == nil || *runAsUser != 65532 {
		fail("runAsUser %v, want 65532 (the image's user)", derefInt64(runAsUser))
	}
	if ps.FSGroup == nil || *ps.FSGroup != 65532 {
		fail("fsGroup %v, want 65532 so the agent can write its claim", derefInt64(ps.FSGroup))
	}
	if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
		fail("readOnlyRootFilesystem is not true")
	}
	if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
		fail("allowPrivilegeEscalation is not false")
	}
	if e := pod.Spec.EnableServiceLinks; e == nil || *e {
		fail("enableServiceLinks is not false: Kubernetes would set SHOAL_PORT, SHOAL_SERVICE_HOST, ... for the Service %q, and the agent reads SHOAL_* variables", sts.Name)
	}

	// Disruptions: one pod at a time.
	if len(m.pdbs) != 1 {
		fail("%d PodDisruptionBudgets, want 1", len(m.pdbs))
	}
	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(podLabels) {
			fail("PodDisruptionBudget %s selector %v does not match the pods (%v)", pdb.Name, pdb.Spec.Selector, err)
		}
		if pdb.Spec.MinAvailable != nil {
			fail("PodDisruptionBudget %s sets minAvailable; want maxUnavailable 1", pdb.Name)
		}
		if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.Type != intstr.Int || mu.IntVal != 1 {
			fail("PodDisruptionBudget %s maxUnavailable %v, want 1: three servers keep quorum with one away", pdb.Name, mu)
		}
	}
	return errs
}

func checkToken(sec *corev1.Secret, name, key string, fail func(string, ...any)) {
	if sec == nil {
		fail("Secret %s is not among the manifests", name)
		return
	}
	v, ok := sec.StringData[key]
	if !ok {
		var b []byte
		b, ok = sec.Data[key]
		v = string(b)
	}
	if !ok {
		fail("Secret %s has no key %s", name, key)
	} else if len(v) < 16 {
		fail("Secret %s %s has %d characters; the agent wants at least 16", name, key, len(v))
	}
}

func secretHas(sec *corev1.Secret, key string) bool {
	if sec == nil {
		return false
	}
	_, a := sec.StringData[key]
	_, b := sec.Data[key]
	return a || b
}

func derefInt64(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func TestKubernetesManifests(t *testing.T) {
	facts := readAgentFacts(t)
	m, err := loadManifests("kubernetes")
	if err != nil {
		t.Fatalf("decoding the manifests: %v", err)
	}
	for _, err := range checkManifests(m, facts) {
		t.Error(err)
	}

	t.Run("strict decoding", func(t *testing.T) {
		for name, doc := range map[string]string{
			"typo in a field":      "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {replica: 3}\n",
			"typo in metadata":     "apiVersion: v1\nkind: Service\nmetadata: {name: x, lables: {a: b}}\n",
			"duplicate field":      "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {A: \"1\"}\ndata: {B: \"2\"}\n",
			"unknown kind":         "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
			"wrong type":           "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {maxUnavailable: [1]}\n",
			"wrong api version":    "apiVersion: apps/v1beta1\nkind: StatefulSet\nmetadata: {name: x}\n",
			"malformed YAML":       "apiVersion: v1\nkind: Service\nmetadata: {name: x\n",
			"port as a bad string": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: \"api\"}]}\n",
		} {
			if _, err := decodeObject([]byte(doc)); err == nil {
				t.Errorf("%s: decoded without an error", name)
			}
		}
		docs := splitYAML([]byte("# a comment\n---\na: 1\n--- # next\nb: 2\n---\n"))
		if len(docs) != 2 {
			t.Errorf("splitYAML found %d documents, want 2", len(docs))
		}
	})

	// Every mutation breaks one invariant; the checks must say so.
	for _, tc := range []struct {
		name   string
		mutate func(m *manifests, c *corev1.Container)
		want   string
	}{
		{"replicas 4 with bootstrap-expect 3", func(m *manifests, c *corev1.Container) {
			n := int32(4)
			m.statefulSets[0].Spec.Replicas = &n
		}, "bootstrap-expect"},
		{"a join address missing", func(m *manifests, c *corev1.Container) {
			c.Command = slices.DeleteFunc(c.Command, func(a string) bool { return strings.Contains(a, "-2.") })
		}, "--join lists"},
		{"a join address of another service", func(m *manifests, c *corev1.Container) {
			for i, a := range c.Command {
				c.Command[i] = strings.Replace(a, ".shoal-headless", ".shoal", 1)
			}
		}, "not the DNS name"},
		{"readiness probe path changed", func(m *manifests, c *corev1.Container) {
			c.ReadinessProbe.HTTPGet.Path = "/v1/healthz"
		}, "readiness probe path"},
		{"readiness without ready=1", func(m *manifests, c *corev1.Container) {
			c.ReadinessProbe.HTTPGet.Path = "/v1/health"
		}, "ready=1"},
		{"liveness asks for readiness", func(m *manifests, c *corev1.Container) {
			c.LivenessProbe.HTTPGet.Path = "/v1/health?ready=1"
		}, "lost quorum"},
		{"probe over HTTP", func(m *manifests, c *corev1.Container) {
			c.LivenessProbe.HTTPGet.Scheme = corev1.URISchemeHTTP
		}, "scheme"},
		{"probe on the gossip port", func(m *manifests, c *corev1.Container) {
			c.ReadinessProbe.HTTPGet.Port = intstr.FromString("gossip-tcp")
		}, "not the API port"},
		{"PDB allows 2", func(m *manifests, c *corev1.Container) {
			v := intstr.FromInt32(2)
			m.pdbs[0].Spec.MaxUnavailable = &v
		}, "maxUnavailable"},
		{"PDB selects other pods", func(m *manifests, c *corev1.Container) {
			m.pdbs[0].Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}
		}, "does not match the pods"},
		{"memory request below the memory limit", func(m *manifests, c *corev1.Container) {
			c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("4Gi")
		}, "below"},
		{"memory limit not set", func(m *manifests, c *corev1.Container) {
			delete(m.configMaps["shoal-config"].Data, "SHOAL_MEMORY_LIMIT")
		}, "SHOAL_MEMORY_LIMIT"},
		{"grace period below the drain timeout", func(m *manifests, c *corev1.Container) {
			g := int64(20)
			m.statefulSets[0].Spec.Template.Spec.TerminationGracePeriodSeconds = &g
		}, "terminationGracePeriodSeconds"},
		{"longer drain timeout", func(m *manifests, c *corev1.Container) {
			m.configMaps["shoal-config"].Data["SHOAL_DRAIN_TIMEOUT"] = "2m"
		}, "terminationGracePeriodSeconds"},
		{"token as a literal", func(m *manifests, c *corev1.Container) {
			for i := range c.Env {
				if c.Env[i].Name == "SHOAL_AGENT_TOKEN" {
					c.Env[i] = corev1.EnvVar{Name: "SHOAL_AGENT_TOKEN", Value: "0123456789abcdef0123"}
				}
			}
		}, "not taken from a Secret"},
		{"token too short", func(m *manifests, c *corev1.Container) {
			m.secrets["shoal-secrets"].StringData["SHOAL_AGENT_TOKEN"] = "short"
		}, "at least 16"},
		{"headless service hides not-ready pods", func(m *manifests, c *corev1.Container) {
			m.services["shoal-headless"].Spec.PublishNotReadyAddresses = false
		}, "publishNotReadyAddresses"},
		{"headless service without gossip UDP", func(m *manifests, c *corev1.Container) {
			hs := m.services["shoal-headless"]
			hs.Spec.Ports = slices.DeleteFunc(hs.Spec.Ports, func(p corev1.ServicePort) bool {
				return p.Port == 7946 && p.Protocol == corev1.ProtocolUDP
			})
		}, "7946/UDP"},
		{"client service selects nothing", func(m *manifests, c *corev1.Container) {
			m.services["shoal"].Spec.Selector = map[string]string{"app.kubernetes.io/name": "shoal-typo"}
		}, "does not select the pods"},
		{"typo in a ConfigMap key", func(m *manifests, c *corev1.Container) {
			cm := m.configMaps["shoal-config"]
			cm.Data["SHOAL_MEMORY_LIMT"] = cm.Data["SHOAL_MEMORY_LIMIT"]
		}, "SHOAL_MEMORY_LIMT"},
		{"unknown flag", func(m *manifests, c *corev1.Container) {
			c.Command = append(c.Command, "--bootstrap-expct=3")
		}, "not a flag"},
		{"OrderedReady", func(m *manifests, c *corev1.Container) {
			m.statefulSets[0].Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
		}, "Parallel"},
		{"service links on", func(m *manifests, c *corev1.Container) {
			m.statefulSets[0].Spec.Template.Spec.EnableServiceLinks = nil
		}, "enableServiceLinks"},
		{"root filesystem writable", func(m *manifests, c *corev1.Container) {
			c.SecurityContext.ReadOnlyRootFilesystem = nil
		}, "readOnlyRootFilesystem"},
		{"data dir not on the claim", func(m *manifests, c *corev1.Container) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == "/data" })
		}, "volumeClaimTemplate"},
		{"a manifest missing from kustomization.yaml", func(m *manifests, c *corev1.Container) {
			m.kustomized = m.kustomized[1:]
		}, "kustomization.yaml"},
	} {
		t.Run("broken/"+tc.name, func(t *testing.T) {
			bad := m.clone()
			tc.mutate(bad, agentContainer(bad.statefulSets[0]))
			errs := checkManifests(bad, facts)
			if len(errs) == 0 {
				t.Fatalf("no error for a broken manifest")
			}
			joined := errors.Join(errs...).Error()
			if !strings.Contains(joined, tc.want) {
				t.Errorf("errors do not mention %q:\n%s", tc.want, joined)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// systemd

type unitFile map[string]map[string][]string // section → key → values in order

// parseUnit reads a systemd unit file: sections, key=value lines, comments
// and backslash continuations.
func parseUnit(text string) (unitFile, error) {
	u := unitFile{}
	section := ""
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		n := i + 1
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: %q is not a section header", n, line)
			}
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not key=value", n, line)
		}
		if section == "" {
			return nil, fmt.Errorf("line %d: %q before any section", n, line)
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		u[section][key] = append(u[section][key], val)
	}
	return u, nil
}

func (u unitFile) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

var spanPartRE = regexp.MustCompile(`^(\d+(?:\.\d+)?)\s*([a-z]*)`)

// parseTimeSpan reads a systemd time span: "60", "60s", "5min", "1min 30s".
func parseTimeSpan(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New("empty time span")
	}
	if s == "infinity" {
		return time.Duration(math.MaxInt64), nil
	}
	units := map[string]time.Duration{
		"": time.Second, "us": time.Microsecond, "usec": time.Microsecond, "ms": time.Millisecond, "msec": time.Millisecond,
		"s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
		"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
		"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour, "d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
	}
	var total time.Duration
	for rest := s; rest != ""; rest = strings.TrimSpace(rest) {
		m := spanPartRE.FindStringSubmatch(rest)
		if m == nil {
			return 0, fmt.Errorf("time span %q: cannot read %q", s, rest)
		}
		unit, ok := units[m[2]]
		if !ok {
			return 0, fmt.Errorf("time span %q: unknown unit %q", s, m[2])
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		total += time.Duration(v * float64(unit))
		rest = rest[len(m[0]):]
	}
	return total, nil
}

func TestParseTimeSpan(t *testing.T) {
	for in, want := range map[string]time.Duration{"60": time.Minute, "45s": 45 * time.Second, "5min": 5 * time.Minute, "1min 30s": 90 * time.Second, "500ms": 500 * time.Millisecond} {
		if got, err := parseTimeSpan(in); err != nil || got != want {
			t.Errorf("parseTimeSpan(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "soon", "5 fortnights"} {
		if _, err := parseTimeSpan(bad); err == nil {
			t.Errorf("parseTimeSpan(%q) accepted", bad)
		}
	}
}

// checkUnit returns what is wrong with the agent's unit.
func checkUnit(u unitFile, drain time.Duration, dataDir string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	svc := u["Service"]
	if svc == nil {
		return []error{errors.New("no [Service] section")}
	}
	if v := u.get("Service", "Type"); v != "notify" {
		fail("Type=%s, want notify: the agent sends READY=1 once it has joined and serves", v)
	}
	if v := u.get("Service", "NotifyAccess"); v != "" && v != "main" && v != "all" {
		fail("NotifyAccess=%s: the agent's own process sends the notifications", v)
	}
	if v := u.get("Service", "Restart"); v != "on-failure" {
		fail("Restart=%s, want on-failure (a drained agent exits 0 and stays stopped)", v)
	}
	if v := u.get("Service", "LimitNOFILE"); v == "" {
		fail("no LimitNOFILE")
	} else if n, err := strconv.Atoi(strings.Split(v, ":")[0]); v != "infinity" && (err != nil || n < 65536) {
		fail("LimitNOFILE=%s, want at least 65536", v)
	}
	if v := u.get("Service", "WatchdogSec"); v == "" {
		fail("no WatchdogSec: the agent pings the watchdog when it is set")
	} else if d, err := parseTimeSpan(v); err != nil || d <= 0 {
		fail("WatchdogSec=%s: want a positive time span (%v)", v, err)
	}
	if v := u.get("Service", "TimeoutStopSec"); v == "" {
		fail("no TimeoutStopSec: systemd's default (90s) is not tied to the drain timeout")
	} else if d, err := parseTimeSpan(v); err != nil {
		fail("TimeoutStopSec=%s: %v", v, err)
	} else if d <= drain {
		fail("TimeoutStopSec=%s is not above the drain timeout %s: systemd would SIGKILL a draining agent", v, drain)
	}
	if v := u.get("Service", "KillSignal"); v != "" && v != "SIGTERM" && v != "TERM" && v != "15" {
		fail("KillSignal=%s: the agent drains on SIGTERM", v)
	}
	argv := strings.Fields(u.get("Service", "ExecStart"))
	if len(argv) < 2 || !path.IsAbs(argv[0]) || path.Base(argv[0]) != "shoal" || argv[1] != "agent" {
		fail("ExecStart=%s, want /ABSOLUTE/PATH/shoal agent ...", strings.Join(argv, " "))
	} else if i := slices.Index(argv, "--config"); i >= 0 && (i+1 >= len(argv) || !path.IsAbs(argv[i+1])) {
		fail("ExecStart --config without an absolute path")
	}
	if v := u.get("Service", "User"); v == "" || v == "root" || v == "0" {
		fail("User=%q: run the agent as its own account", v)
	}
	state := u.get("Service", "StateDirectory")
	if state == "" {
		fail("no StateDirectory: the agent's data dir should be /var/lib/<name>, owned by its user")
	} else if dataDir != "" && path.Clean(dataDir) != "/var/lib/"+state {
		fail("StateDirectory=%s but the example config's data_dir is %s", state, dataDir)
	}
	if u.get("Service", "ProtectSystem") == "strict" && state == "" && !slices.Contains(strings.Fields(strings.Join(svc["ReadWritePaths"], " ")), path.Clean(dataDir)) {
		fail("ProtectSystem=strict without a writable data dir (StateDirectory or ReadWritePaths)")
	}
	if v := u.get("Service", "NoNewPrivileges"); v != "yes" && v != "true" {
		fail("NoNewPrivileges is not set")
	}
	for _, dep := range []string{"After", "Wants"} {
		if !slices.Contains(strings.Fields(strings.Join(u["Unit"][dep], " ")), "network-online.target") {
			fail("[Unit] %s does not name network-online.target: the agent joins others over the network at start", dep)
		}
	}
	if !slices.Contains(strings.Fields(strings.Join(u["Install"]["WantedBy"], " ")), "multi-user.target") {
		fail("[Install] WantedBy does not name multi-user.target")
	}
	return errs
}

// verifyUnit runs systemd-analyze verify on the unit with ExecStart's
// program replaced by exe (an executable that exists here), and returns
// what it reports about the unit.
func verifyUnit(t *testing.T, analyze, text, exe string) error {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "ExecStart" {
			f := strings.Fields(v)
			if len(f) > 0 {
				f[0] = exe
			}
			line = "ExecStart=" + strings.Join(f, " ")
		}
		out = append(out, line)
	}
	unit := filepath.Join(dir, "shoal.service")
	if err := os.WriteFile(unit, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", "--man=no", unit)
	b, err := cmd.CombinedOutput()
	var problems []string
	for _, line := range strings.Split(string(b), "\n") {
		// Lines about other units (ones this host lacks) are not ours.
		if strings.Contains(line, "shoal.service") {
			problems = append(problems, line)
		}
	}
	if err != nil || len(problems) > 0 {
		return fmt.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(problems, "\n"))
	}
	return nil
}

// exampleConfig reads deploy/systemd/agent.json.example as the agent's
// decoder would (no unknown keys), into a map of raw values.
func exampleConfig(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile("systemd/agent.json.example")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := decodeOneJSON(b, &m); err != nil {
		t.Fatalf("agent.json.example: %v", err)
	}
	return m
}

func decodeOneJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("content after the JSON object")
	}
	return nil
}

func exampleDrain(t *testing.T, facts agentFacts) time.Duration {
	t.Helper()
	raw, ok := exampleConfig(t)["drain_timeout"]
	if !ok {
		return facts.drainDefault
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("drain_timeout %s: want a string such as \"30s\"", raw)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("drain_timeout: %v", err)
	}
	return max(d, facts.drainDefault)
}

func TestSystemdUnit(t *testing.T) {
	facts := readAgentFacts(t)
	b, err := os.ReadFile("systemd/shoal.service")
	if err != nil {
		t.Fatal(err)
	}
	u, err := parseUnit(string(b))
	if err != nil {
		t.Fatalf("shoal.service: %v", err)
	}
	var dataDir string
	if raw, ok := exampleConfig(t)["data_dir"]; ok {
		_ = json.Unmarshal(raw, &dataDir)
	}
	for _, err := range checkUnit(u, exampleDrain(t, facts), dataDir) {
		t.Error(err)
	}

	t.Run("checks fail on a broken unit", func(t *testing.T) {
		for name, edit := range map[string]struct{ section, key, value string }{
			"Type=simple":          {"Service", "Type", "simple"},
			"short stop timeout":   {"Service", "TimeoutStopSec", "20"},
			"stop timeout = drain": {"Service", "TimeoutStopSec", "30s"},
			"not the agent":        {"Service", "ExecStart", "/usr/local/bin/shoal up"},
			"relative program":     {"Service", "ExecStart", "shoal agent"},
			"no watchdog":          {"Service", "WatchdogSec", ""},
			"restart always":       {"Service", "Restart", "always"},
			"few files":            {"Service", "LimitNOFILE", "1024"},
			"as root":              {"Service", "User", "root"},
			"state dir elsewhere":  {"Service", "StateDirectory", "other"},
			"SIGINT":               {"Service", "KillSignal", "SIGKILL"},
			"before the network":   {"Unit", "After", "local-fs.target"},
			"not enabled at boot":  {"Install", "WantedBy", "default.target"},
		} {
			bad, err := parseUnit(string(b))
			if err != nil {
				t.Fatal(err)
			}
			if edit.value == "" {
				delete(bad[edit.section], edit.key)
			} else {
				bad[edit.section][edit.key] = []string{edit.value}
			}
			if errs := checkUnit(bad, exampleDrain(t, facts), dataDir); len(errs) == 0 {
				t.Errorf("%s: no error", name)
			}
		}
		if _, err := parseUnit("Type=notify\n"); err == nil {
			t.Errorf("a key outside any section was accepted")
		}
		if _, err := parseUnit("[Service]\nnot a key value line\n"); err == nil {
			t.Errorf("a line without = was accepted")
		}
	})

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: skipping systemd-analyze verify (the unit's own checks ran)")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("systemd-analyze verify", func(t *testing.T) {
		if err := verifyUnit(t, analyze, string(b), exe); err != nil {
			t.Error(err)
		}
	})
	t.Run("systemd-analyze verify reports a typo", func(t *testing.T) {
		bad := strings.Replace(string(b), "Restart=on-failure", "Restrat=on-failure", 1)
		if err := verifyUnit(t, analyze, bad, exe); err == nil {
			t.Errorf("a unit with an unknown key passed verify: the output filter hides real problems")
		}
	})
}

// ---------------------------------------------------------------------------
// launchd

// parsePlist decodes an XML property list whose root is a dict.
func parsePlist(data []byte) (map[string]any, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	start, err := nextElement(dec)
	if err != nil {
		return nil, err
	}
	se, ok := start.(xml.StartElement)
	if !ok || se.Name.Local != "plist" {
		return nil, fmt.Errorf("root element is %v, want <plist>", start)
	}
	tok, err := nextElement(dec)
	if err != nil {
		return nil, err
	}
	se, ok = tok.(xml.StartElement)
	if !ok || se.Name.Local != "dict" {
		return nil, fmt.Errorf("<plist> holds %v, want <dict>", tok)
	}
	v, err := plistValue(dec, se)
	if err != nil {
		return nil, err
	}
	if tok, err := nextElement(dec); err != nil {
		return nil, err
	} else if ee, ok := tok.(xml.EndElement); !ok || ee.Name.Local != "plist" {
		return nil, fmt.Errorf("<plist> holds more than one value: %v", tok)
	}
	if tok, err := nextElement(dec); err != io.EOF {
		return nil, fmt.Errorf("content after </plist>: %v %v", tok, err)
	}
	return v.(map[string]any), nil
}

// nextElement returns the next start or end element, skipping comments,
// processing instructions, the DOCTYPE and whitespace; other text is an
// error.
func nextElement(dec *xml.Decoder) (xml.Token, error) {
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement, xml.EndElement:
			return t, nil
		case xml.CharData:
			if s := strings.TrimSpace(string(t)); s != "" {
				return nil, fmt.Errorf("text %q between elements", s)
			}
		}
	}
}

func plistText(dec *xml.Decoder, name string) (string, error) {
	var sb strings.Builder
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		switch t := tok.(type) {
		case xml.CharData:
			sb.Write(t)
		case xml.EndElement:
			if t.Name.Local != name {
				return "", fmt.Errorf("</%s> inside <%s>", t.Name.Local, name)
			}
			return sb.String(), nil
		case xml.StartElement:
			return "", fmt.Errorf("<%s> inside <%s>", t.Name.Local, name)
		}
	}
}

func plistValue(dec *xml.Decoder, se xml.StartElement) (any, error) {
	switch name := se.Name.Local; name {
	case "dict":
		d := map[string]any{}
		for {
			tok, err := nextElement(dec)
			if err != nil {
				return nil, err
			}
			if ee, ok := tok.(xml.EndElement); ok && ee.Name.Local == "dict" {
				return d, nil
			}
			ks, ok := tok.(xml.StartElement)
			if !ok || ks.Name.Local != "key" {
				return nil, fmt.Errorf("<dict> holds %v where a <key> belongs", tok)
			}
			key, err := plistText(dec, "key")
			if err != nil {
				return nil, err
			}
			if _, dup := d[key]; dup {
				return nil, fmt.Errorf("key %q twice", key)
			}
			tok, err = nextElement(dec)
			if err != nil {
				return nil, err
			}
			vs, ok := tok.(xml.StartElement)
			if !ok || vs.Name.Local == "key" {
				return nil, fmt.Errorf("key %q has no value", key)
			}
			if d[key], err = plistValue(dec, vs); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
		}
	case "array":
		a := []any{}
		for {
			tok, err := nextElement(dec)
			if err != nil {
				return nil, err
			}
			if ee, ok := tok.(xml.EndElement); ok && ee.Name.Local == "array" {
				return a, nil
			}
			vs, ok := tok.(xml.StartElement)
			if !ok {
				return nil, fmt.Errorf("<array> holds %v", tok)
			}
			v, err := plistValue(dec, vs)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
	case "string", "date", "data":
		return plistText(dec, name)
	case "integer":
		s, err := plistText(dec, name)
		if err != nil {
			return nil, err
		}
		return strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	case "real":
		s, err := plistText(dec, name)
		if err != nil {
			return nil, err
		}
		return strconv.ParseFloat(strings.TrimSpace(s), 64)
	case "true", "false":
		s, err := plistText(dec, name)
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(s) != "" {
			return nil, fmt.Errorf("<%s> holds text %q", name, s)
		}
		return name == "true", nil
	default:
		return nil, fmt.Errorf("<%s> is not a property list element", name)
	}
}

// launchdKeys are the launchd.plist keys a job of this kind may use; a key
// launchd does not know (ExitTimeout for ExitTimeOut) is silently ignored
// by it, so the test refuses it.
var launchdKeys = map[string]bool{
	"Label": true, "Program": true, "ProgramArguments": true, "RunAtLoad": true, "KeepAlive": true,
	"WorkingDirectory": true, "StandardOutPath": true, "StandardErrorPath": true, "ExitTimeOut": true,
	"ThrottleInterval": true, "SoftResourceLimits": true, "HardResourceLimits": true, "EnvironmentVariables": true,
	"UserName": true, "GroupName": true, "ProcessType": true, "Nice": true, "Umask": true, "Disabled": true,
	"AbandonProcessGroup": true, "LowPriorityIO": true,
}

var launchdResourceKeys = map[string]bool{
	"Core": true, "CPU": true, "Data": true, "FileSize": true, "MemoryLock": true,
	"NumberOfFiles": true, "NumberOfProcesses": true, "ResidentSetSize": true, "Stack": true,
}

func checkPlist(p map[string]any, drain time.Duration) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for k := range p {
		if !launchdKeys[k] {
			fail("key %q is not a launchd job key (launchd would ignore it)", k)
		}
	}
	if v, _ := p["Label"].(string); v != "dev.shoal.agent" {
		fail("Label %q, want dev.shoal.agent", v)
	}
	args, _ := p["ProgramArguments"].([]any)
	var argv []string
	for _, a := range args {
		s, ok := a.(string)
		if !ok {
			fail("ProgramArguments holds %v, want strings", a)
		}
		argv = append(argv, s)
	}
	if len(argv) < 2 || !path.IsAbs(argv[0]) || path.Base(argv[0]) != "shoal" || argv[1] != "agent" {
		fail("ProgramArguments %q, want /ABSOLUTE/PATH/shoal agent ...", argv)
	} else if i := slices.Index(argv, "--config"); i >= 0 && (i+1 >= len(argv) || !path.IsAbs(argv[i+1])) {
		fail("--config without an absolute path")
	}
	if v, ok := p["RunAtLoad"].(bool); !ok || !v {
		fail("RunAtLoad is not true")
	}
	switch ka := p["KeepAlive"].(type) {
	case bool:
		if !ka {
			fail("KeepAlive is false: a crashed agent would stay down")
		}
	case map[string]any:
		if se, ok := ka["SuccessfulExit"]; ok && se != false {
			fail("KeepAlive SuccessfulExit %v: true would restart only clean exits", se)
		}
		if len(ka) == 0 {
			fail("KeepAlive is an empty dict")
		}
	default:
		fail("KeepAlive missing or not a bool or dict (%T)", ka)
	}
	for _, k := range []string{"StandardOutPath", "StandardErrorPath", "WorkingDirectory"} {
		if v, ok := p[k].(string); !ok || !path.IsAbs(v) {
			fail("%s %q is not an absolute path", k, v)
		}
	}
	if v, ok := p["ExitTimeOut"].(int64); !ok || time.Duration(v)*time.Second <= drain {
		fail("ExitTimeOut %v is not above the drain timeout %s: launchd would SIGKILL a draining agent", p["ExitTimeOut"], drain)
	}
	for _, lk := range []string{"SoftResourceLimits", "HardResourceLimits"} {
		l, ok := p[lk].(map[string]any)
		if !ok {
			if lk == "SoftResourceLimits" {
				fail("no SoftResourceLimits")
			}
			continue
		}
		for k := range l {
			if !launchdResourceKeys[k] {
				fail("%s key %q is not a resource limit", lk, k)
			}
		}
		if n, ok := l["NumberOfFiles"].(int64); !ok || n < 65536 {
			fail("%s NumberOfFiles %v, want at least 65536", lk, l["NumberOfFiles"])
		}
	}
	if env, ok := p["EnvironmentVariables"].(map[string]any); ok {
		if _, has := env["SHOAL_AGENT_TOKEN"]; has {
			fail("SHOAL_AGENT_TOKEN in the plist: /Library/LaunchDaemons files are world-readable")
		}
	}
	return errs
}

func TestLaunchdPlist(t *testing.T) {
	facts := readAgentFacts(t)
	b, err := os.ReadFile("launchd/dev.shoal.agent.plist")
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePlist(b)
	if err != nil {
		t.Fatalf("dev.shoal.agent.plist: %v", err)
	}
	drain := exampleDrain(t, facts)
	for _, err := range checkPlist(p, drain) {
		t.Error(err)
	}
	if args := p["ProgramArguments"].([]any); len(args) != 4 || args[2] != "--config" || args[3] != "/usr/local/etc/shoal/agent.json" {
		t.Errorf("ProgramArguments %v, want shoal agent --config /usr/local/etc/shoal/agent.json", args)
	}

	t.Run("malformed", func(t *testing.T) {
		const head = `<?xml version="1.0" encoding="UTF-8"?>` + "\n"
		for name, doc := range map[string]string{
			"unterminated":        head + `<plist version="1.0"><dict><key>Label</key><string>x</string>`,
			"mismatched tags":     head + `<plist version="1.0"><dict><key>Label</key><string>x</dict></string></plist>`,
			"root array":          head + `<plist version="1.0"><array><string>x</string></array></plist>`,
			"root not plist":      head + `<dict><key>Label</key><string>x</string></dict>`,
			"key without value":   head + `<plist version="1.0"><dict><key>Label</key></dict></plist>`,
			"key after key":       head + `<plist version="1.0"><dict><key>Label</key><key>RunAtLoad</key><true/></dict></plist>`,
			"value without key":   head + `<plist version="1.0"><dict><string>x</string></dict></plist>`,
			"duplicate key":       head + `<plist version="1.0"><dict><key>A</key><true/><key>A</key><false/></dict></plist>`,
			"bad integer":         head + `<plist version="1.0"><dict><key>ExitTimeOut</key><integer>sixty</integer></dict></plist>`,
			"unknown element":     head + `<plist version="1.0"><dict><key>A</key><bool>true</bool></dict></plist>`,
			"stray text":          head + `<plist version="1.0"><dict>oops<key>A</key><true/></dict></plist>`,
			"two values":          head + `<plist version="1.0"><dict></dict><dict></dict></plist>`,
			"after plist":         head + `<plist version="1.0"><dict></dict></plist><plist/>`,
			"element in string":   head + `<plist version="1.0"><dict><key>A</key><string><b>x</b></string></dict></plist>`,
			"text in true":        head + `<plist version="1.0"><dict><key>A</key><true>yes</true></dict></plist>`,
			"not XML at all":      `{"Label": "dev.shoal.agent"}`,
			"unescaped ampersand": head + `<plist version="1.0"><dict><key>A&B</key><true/></dict></plist>`,
		} {
			if _, err := parsePlist([]byte(doc)); err == nil {
				t.Errorf("%s: parsed without an error", name)
			}
		}
	})

	t.Run("checks fail on a broken job", func(t *testing.T) {
		for name, edit := range map[string][2]string{
			"ExitTimeout typo":   {"<key>ExitTimeOut</key>", "<key>ExitTimeout</key>"},
			"short exit timeout": {"<integer>60</integer>", "<integer>10</integer>"},
			"not the agent":      {"<string>agent</string>", "<string>up</string>"},
			"relative log path":  {"<string>/usr/local/var/log/shoal/agent.log</string>", "<string>agent.log</string>"},
			"RunAtLoad false":    {"<key>RunAtLoad</key>\n  <true/>", "<key>RunAtLoad</key>\n  <false/>"},
		} {
			text := strings.Replace(string(b), edit[0], edit[1], 1)
			if text == string(b) {
				t.Fatalf("%s: the plist has no %q to change", name, edit[0])
			}
			bad, err := parsePlist([]byte(text))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if errs := checkPlist(bad, drain); len(errs) == 0 {
				t.Errorf("%s: no error", name)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// The agent's --config file

// configFields reads the JSON keys of node.Config and their Go types from
// its source: the agent decodes --config into that struct with unknown
// fields disallowed.
func configFields(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, configSourceGo, nil, 0)
	if err != nil {
		t.Fatalf("the agent's config struct is read from its source: %v", err)
	}
	fields := map[string]string{}
	ast.Inspect(file, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		for _, f := range st.Fields.List {
			if f.Tag == nil {
				continue
			}
			tag, _ := strconv.Unquote(f.Tag.Value)
			name, _, _ := strings.Cut(reflectTag(tag, "json"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[name] = typeString(f.Type)
		}
		return false
	})
	if len(fields) == 0 {
		t.Fatalf("found no JSON fields of type Config in %s", configSourceGo)
	}
	return fields
}

func reflectTag(tag, key string) string {
	for _, part := range strings.Fields(tag) {
		if k, v, ok := strings.Cut(part, ":"); ok && k == key {
			s, _ := strconv.Unquote(v)
			return s
		}
	}
	return ""
}

func typeString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.ArrayType:
		return "[]" + typeString(t.Elt)
	case *ast.SelectorExpr:
		return typeString(t.X) + "." + t.Sel.Name
	case *ast.StarExpr:
		return "*" + typeString(t.X)
	}
	return fmt.Sprintf("%T", e)
}

// checkConfigValue tells whether a JSON value decodes into a field of the
// Go type.
func checkConfigValue(goType string, raw json.RawMessage) error {
	var err error
	switch goType {
	case "string":
		var v string
		err = json.Unmarshal(raw, &v)
	case "bool":
		var v bool
		err = json.Unmarshal(raw, &v)
	case "int":
		var v int
		err = json.Unmarshal(raw, &v)
	case "uint64":
		var v uint64
		err = json.Unmarshal(raw, &v)
	case "[]string":
		var v []string
		err = json.Unmarshal(raw, &v)
	case "Duration": // node.Duration: "30s" or nanoseconds
		var s string
		if json.Unmarshal(raw, &s) == nil {
			_, err = time.ParseDuration(s)
		} else {
			var n int64
			err = json.Unmarshal(raw, &n)
		}
	default:
		return fmt.Errorf("the test does not know how to check a %s value", goType)
	}
	if err != nil {
		return fmt.Errorf("%s does not decode into a %s: %v", raw, goType, err)
	}
	return nil
}

// checkAgentConfig returns what the agent would refuse in a --config file.
func checkAgentConfig(b []byte, fields map[string]string, facts agentFacts) []error {
	var errs []error
	var m map[string]json.RawMessage
	if err := decodeOneJSON(b, &m); err != nil {
		return []error{err}
	}
	for _, k := range sortedKeys(m) {
		goType, ok := fields[k]
		if !ok {
			errs = append(errs, fmt.Errorf("key %q is not a field of the agent's config (node.Config): the agent refuses unknown keys", k))
			continue
		}
		if _, ok := facts.flags[strings.ReplaceAll(k, "_", "-")]; !ok {
			errs = append(errs, fmt.Errorf("key %q has no flag --%s: use the settings shoal agent --help documents", k, strings.ReplaceAll(k, "_", "-")))
		}
		if err := checkConfigValue(goType, m[k]); err != nil {
			errs = append(errs, fmt.Errorf("key %q: %v", k, err))
		}
	}
	// The agent's own rules for a bootstrapping server.
	var c struct {
		Server          bool     `json:"server"`
		BootstrapExpect int      `json:"bootstrap_expect"`
		Join            []string `json:"join"`
		DataDir         string   `json:"data_dir"`
	}
	if err := json.Unmarshal(b, &c); err == nil {
		if c.BootstrapExpect > 0 && !c.Server {
			errs = append(errs, errors.New("bootstrap_expect without server: true"))
		}
		if c.BootstrapExpect > 1 && len(c.Join) == 0 {
			errs = append(errs, errors.New("bootstrap_expect > 1 without join addresses"))
		}
		if c.DataDir == "" || !path.IsAbs(c.DataDir) {
			errs = append(errs, fmt.Errorf("data_dir %q: want an absolute path", c.DataDir))
		}
	}
	return errs
}

func TestAgentConfigExample(t *testing.T) {
	facts := readAgentFacts(t)
	fields := configFields(t)
	for _, want := range []string{"server", "bootstrap_expect", "data_dir", "join", "name"} {
		if _, ok := fields[want]; !ok {
			t.Fatalf("node.Config has no JSON field %q (parsed %v)", want, fields)
		}
	}
	b, err := os.ReadFile("systemd/agent.json.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range checkAgentConfig(b, fields, facts) {
		t.Error(err)
	}
	var c map[string]any
	_ = json.Unmarshal(b, &c)
	if _, ok := c["token"]; ok {
		t.Errorf("the example holds a token: it belongs in /etc/shoal/shoal.env (SHOAL_AGENT_TOKEN), readable by root only")
	}

	t.Run("refuses what the agent refuses", func(t *testing.T) {
		for name, doc := range map[string]string{
			"dashed key":          `{"server": true, "bootstrap-expect": 3, "join": ["a"], "data_dir": "/d"}`,
			"unknown key":         `{"servers": true, "data_dir": "/d"}`,
			"size as a string":    `{"memory_limit": "6GiB", "data_dir": "/d"}`,
			"join as a string":    `{"join": "mac1", "data_dir": "/d"}`,
			"bad duration":        `{"drain_timeout": "half a minute", "data_dir": "/d"}`,
			"expect without join": `{"server": true, "bootstrap_expect": 3, "data_dir": "/d"}`,
			"expect on a client":  `{"bootstrap_expect": 3, "join": ["a"], "data_dir": "/d"}`,
			"no data dir":         `{"server": true}`,
			"not JSON":            `server = true`,
			"two objects":         `{"data_dir": "/d"} {"name": "x"}`,
			"no flag for it":      `{"https": "off", "data_dir": "/d"}`,
		} {
			if errs := checkAgentConfig([]byte(doc), fields, facts); len(errs) == 0 {
				t.Errorf("%s: accepted", name)
			}
		}
	})
}
