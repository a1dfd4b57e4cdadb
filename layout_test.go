// The layout is the design: this test keeps the repository's top level,
// its package docs and its import directions as ARCHITECTURE.md draws them.
// `make lint` runs it.
package shoal_test

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// topLevel is every folder the repository may have at its top: one concern
// each (disagg and deploy arrive with the issues that fill them).
var topLevel = map[string]bool{
	"api": true, "catalog": true, "cmd": true, "coordinator": true, "deploy": true, "disagg": true, "engine": true, "hub": true,
	"internal": true, "node": true, "parallel": true, "placement": true, "serve": true, "shard": true,
	"transport": true, "docs": true, "gateway": true,
}

// mayImport lists, for each top-level folder, the other top-level folders
// its packages may import; a package may always import from its own
// folder. Dependencies point one way:
// cmd → node → {api, catalog, coordinator, disagg, gateway, parallel, serve, shard, transport} → {engine, placement} → internal
// (gateway, the request path to a model's driver, sits on api/openai, transport and
// the driver's scheduler, serve);
// hub (models from Hugging Face: resolve, download, verify, the model store)
// is a leaf beside them that node, catalog and cmd use (#25): shard must not
// speak HTTP, so the hub's byte ranges reach it through catalog. catalog
// (models and their files, #34) acts on the state the coordinator's pure
// functions read and serves its files over transport.
var mayImport = map[string][]string{
	"internal":    {},
	"deploy":      {},
	"docs":        {},
	"hub":         {"internal"},
	"engine":      {"internal"},
	"placement":   {"engine", "internal"},
	"transport":   {"engine", "internal"},
	"serve":       {"engine", "internal"},
	"shard":       {"engine", "placement", "internal"},
	"coordinator": {"placement", "internal"},
	"api":         {"internal"},
	"parallel":    {"engine", "placement", "shard", "transport", "serve", "internal"},
	"disagg":      {"engine", "placement", "shard", "transport", "serve", "parallel", "internal"},
	"catalog":     {"api", "coordinator", "hub", "shard", "transport", "engine", "placement", "internal"},
	"gateway":     {"api", "serve", "transport", "engine", "internal"},
	"node":        {"api", "catalog", "coordinator", "disagg", "gateway", "hub", "parallel", "serve", "shard", "transport", "engine", "placement", "internal"},
	"cmd":         {"node", "api", "catalog", "coordinator", "disagg", "gateway", "hub", "parallel", "serve", "shard", "transport", "engine", "placement", "internal"},
}

// testFixtures lists what tests may import beyond mayImport: a running
// agent cluster (node, node/nodetest), a scheduler (serve) or a model on
// it (gateway) for the API's end-to-end tests, a synthetic model and its tokenizer (engine), test
// plans and shard slicing for the engine's layer-range tests, the QUIC Raft
// layer for the coordinator's cluster tests, a fake hub for the guide's
// test (docs). Product code never does.
var testFixtures = map[string][]string{
	"api":         {"node", "gateway", "serve", "engine"},
	"engine":      {"placement", "shard"},
	"coordinator": {"transport"},
	"docs":        {"hub"},
}

// partsOf lists folders whose subpackages are parts of the package there:
// only that package and its other parts may import them (node/links,
// node/fingerprint: the agent wires them), except the few listed, which
// others may (node/nodetest, a test cluster: see testFixtures).
var partsOf = map[string][]string{
	"shoal/node": {"shoal/node/nodetest"},
}

// partOf is the folder of partsOf that path is a part of ("" when none).
func partOf(path string) string {
	for parent, open := range partsOf {
		if strings.HasPrefix(path, parent+"/") && !slices.Contains(open, path) {
			return parent
		}
	}
	return ""
}

type listedPackage struct {
	ImportPath   string
	Dir          string
	Name         string
	GoFiles      []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// packages lists every package of the module with its imports, integration
// tests included.
func packages(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "integration", "-json", "./...")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// folderOf is the top-level folder of a shoal import path ("" for the
// module root, "-" for a path outside the module).
func folderOf(path string) string {
	if path == "shoal" {
		return ""
	}
	rest, ok := strings.CutPrefix(path, "shoal/")
	if !ok {
		return "-"
	}
	top, _, _ := strings.Cut(rest, "/")
	return top
}

func TestTopLevelFolders(t *testing.T) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	seen := map[string]bool{}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		top, _, isDir := strings.Cut(f, "/")
		if !isDir || strings.HasPrefix(top, ".") || seen[top] {
			continue
		}
		seen[top] = true
		if !topLevel[top] {
			t.Errorf("top-level folder %q is not one of the concerns in ARCHITECTURE.md; move it into the package that owns it", top)
		}
	}
}

func TestEveryPackageHasDoc(t *testing.T) {
	for _, p := range packages(t) {
		if folderOf(p.ImportPath) == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(p.Dir, "doc.go"))
		if err != nil {
			t.Errorf("%s has no doc.go saying what it owns and what it must not do", p.ImportPath)
			continue
		}
		if !strings.Contains(string(b), "// Package "+p.Name+" ") && !strings.Contains(string(b), "// Command ") {
			t.Errorf("%s/doc.go does not start its comment with \"Package %s\"", p.ImportPath, p.Name)
		}
	}
}

func TestImportDirections(t *testing.T) {
	for _, p := range packages(t) {
		from := folderOf(p.ImportPath)
		if from == "" {
			continue
		}
		allowed, known := mayImport[from]
		if !known {
			t.Errorf("%s: folder %q has no row in mayImport", p.ImportPath, from)
			continue
		}
		ok := map[string]bool{from: true}
		for _, a := range allowed {
			ok[a] = true
		}
		var bad []string
		for _, imp := range p.Imports {
			if to := folderOf(imp); to != "-" && !ok[to] {
				bad = append(bad, imp)
			}
		}
		for _, a := range testFixtures[from] {
			ok[a] = true
		}
		for _, imp := range append(append([]string{}, p.TestImports...), p.XTestImports...) {
			if to := folderOf(imp); to != "-" && !ok[to] {
				bad = append(bad, imp+" (in a test)")
			}
		}
		for _, imp := range append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...) {
			if parent := partOf(imp); parent != "" && p.ImportPath != parent && !strings.HasPrefix(p.ImportPath, parent+"/") {
				t.Errorf("%s imports %s: that is a part of %s, which only %s and its parts may import (see partsOf)", p.ImportPath, imp, parent, parent)
			}
		}
		sort.Strings(bad)
		for i, imp := range bad {
			if i == 0 || bad[i-1] != imp {
				t.Errorf("%s imports %s: %s may not depend on %s (see mayImport)", p.ImportPath, imp, from, folderOf(strings.TrimSuffix(imp, " (in a test)")))
			}
		}
	}
}

// seamBelow lists the engine packages the device seam (engine/device, its
// contracts, and the devices under it) stands on. A device imports only
// them (and the seam); they import neither the seam nor engine/model above
// it, so a GPU backend plugs in without a cycle.
var seamBelow = []string{"shoal/engine/kernels", "shoal/engine/kv", "shoal/engine/quant", "shoal/engine/gguf"}

func TestImportDirectionsDeviceSeam(t *testing.T) {
	under := func(path, pkg string) bool { return path == pkg || strings.HasPrefix(path, pkg+"/") }
	below := func(path string) bool {
		for _, b := range seamBelow {
			if under(path, b) {
				return true
			}
		}
		return false
	}
	for _, p := range packages(t) {
		for _, imp := range p.Imports {
			if folderOf(imp) == "-" {
				continue
			}
			switch {
			case under(p.ImportPath, "shoal/engine/device") && !below(imp) && !under(imp, "shoal/engine/device"):
				t.Errorf("%s imports %s: the device seam may import only %v", p.ImportPath, imp, seamBelow)
			case below(p.ImportPath) && (under(imp, "shoal/engine/device") || under(imp, "shoal/engine/model")):
				t.Errorf("%s imports %s: what the device seam stands on may not import it or engine/model", p.ImportPath, imp)
			}
		}
	}
}
