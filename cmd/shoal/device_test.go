package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRunWithoutVulkan runs `shoal run --device auto` where no Vulkan
// loader can be found (a child process with SHOAL_VULKAN_LIB pointing
// nowhere): it says why in one line and generates on the CPU; the same
// text as --device cpu. --device vulkan there is an error naming the
// missing loader.
func TestRunWithoutVulkan(t *testing.T) {
	if dir := os.Getenv("SHOAL_DEVICE_CHILD"); dir != "" {
		path := genModel(t, dir)
		run := func(dev string) (string, string, error) {
			cmd := rootCmd()
			var out, errb bytes.Buffer
			cmd.SetArgs([]string{"run", "-m", path, "-p", "Once upon a time", "-n", "12", "--seed", "1", "--stats=false", "--device", dev})
			cmd.SetOut(&out)
			cmd.SetErr(&errb)
			err := cmd.Execute()
			return out.String(), errb.String(), err
		}
		out, stderr, err := run("auto")
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("--device auto without a loader: %v, %q", err, out)
		}
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "device: cpu (no Vulkan: no Vulkan loader") {
			t.Fatalf("stderr %q: want one line saying the CPU runs it and why", stderr)
		}
		onCPU, _, err := run("cpu")
		if err != nil || onCPU != out {
			t.Fatalf("--device cpu: %v, %q; auto gave %q", err, onCPU, out)
		}
		if _, _, err := run("vulkan"); err == nil || !strings.Contains(err.Error(), "no Vulkan loader") {
			t.Fatalf("--device vulkan without a loader: %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunWithoutVulkan$", "-test.v")
	cmd.Env = append(os.Environ(), "SHOAL_DEVICE_CHILD="+t.TempDir(), "SHOAL_VULKAN_LIB=/nonexistent/libvulkan.so.1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestRunWithoutVulkan") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
