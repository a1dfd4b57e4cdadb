package node_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/node"
)

// TestLoadConfigFile: a config file takes the keys as the flags name them
// (sizes as text, role, insecure_http) as well as the Config's own, and
// refuses what it does not know, two objects, and a size it cannot read.
func TestLoadConfigFile(t *testing.T) {
	load := func(text string) (node.Config, error) {
		p := filepath.Join(t.TempDir(), "agent.json")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		var c node.Config
		err := node.LoadConfigFile(p, &c)
		return c, err
	}
	c, err := load(`{"name": "n1", "data_dir": "/d", "memory_limit": "8GiB", "disk_limit": 1000, "role": "decode",
		"insecure_http": true, "drain_timeout": "45s", "net_telemetry": "quic"}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.MemoryLimit != 8<<30 || c.DiskLimit != 1000 || c.Serves != "decode" || c.HTTPS != node.HTTPSOff ||
		time.Duration(c.DrainTimeout) != 45*time.Second || c.NetTelemetry != "quic" || c.Name != "n1" {
		t.Fatalf("loaded %+v", c)
	}
	for _, bad := range []struct{ text, want string }{
		{`{"nmae": "x"}`, "unknown field"},
		{`{"name": "a"} {"name": "b"}`, "more than one JSON object"},
		{`{"memory_limit": "lots"}`, "not a size"},
		{`{"role": "decode", "serves": "prefill"}`, "keep one"},
		{`{"insecure_http": "yes"}`, "true or false"},
	} {
		if _, err := load(bad.text); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: err %v, want %q", bad.text, err, bad.want)
		}
	}
}
