package fingerprint

import (
	"os"
	"path/filepath"
	"testing"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, v := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCgroupMemory: an agent in a container or a systemd unit with a
// memory limit offers that limit, not the host's memory.
func TestCgroupMemory(t *testing.T) {
	for _, tc := range []struct {
		name         string
		self         string
		files        map[string]string
		limit, usage uint64
		ok           bool
	}{
		{"v2 container (its cgroup is the mount's root)", "0::/\n",
			map[string]string{"memory.max": "8589934592", "memory.current": "1073741824"}, 8 << 30, 1 << 30, true},
		{"v2 unit, the parent's limit is lower", "0::/system.slice/shoal.service\n",
			map[string]string{"system.slice/shoal.service/memory.max": "max", "system.slice/shoal.service/memory.current": "5",
				"system.slice/memory.max": "4294967296", "system.slice/memory.current": "7"}, 4 << 30, 7, true},
		{"v2 without a limit", "0::/user.slice\n", map[string]string{"user.slice/memory.max": "max", "memory.max": "max"}, 0, 0, false},
		{"v1 docker", "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
			map[string]string{"memory/docker/abc/memory.limit_in_bytes": "2147483648", "memory/docker/abc/memory.usage_in_bytes": "100"}, 2 << 30, 100, true},
		{"v1 unlimited (the kernel's page-rounded max)", "4:memory:/\n",
			map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712"}, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			limit, usage, ok := cgroupMemory(root, tc.self)
			if limit != tc.limit || usage != tc.usage || ok != tc.ok {
				t.Fatalf("got limit %d usage %d ok %v, want %d %d %v", limit, usage, ok, tc.limit, tc.usage, tc.ok)
			}
		})
	}
}
