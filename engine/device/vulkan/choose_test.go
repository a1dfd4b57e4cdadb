package vulkan

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"shoal/engine/device/cpu"
	"shoal/engine/device/vulkan/vk"
)

// TestChoose resolves each --device value: cpu; auto, which takes no
// CPU-type Vulkan device (lavapipe) and says why it chose the CPU; vulkan
// and vulkan:N, which take lavapipe when asked for and fail clearly for a
// device that is not there; and a bad value.
func TestChoose(t *testing.T) {
	if d, line, err := Choose("cpu"); err != nil || d != (cpu.Device{}) || line != "cpu" {
		t.Fatalf("cpu: %v %q %v", d, line, err)
	}
	if _, _, err := Choose("gpu"); err == nil || !strings.Contains(err.Error(), "want auto, cpu, vulkan or vulkan:N") {
		t.Fatalf("gpu: %v", err)
	}
	if _, _, err := Choose("vulkan:x"); err == nil {
		t.Fatal("vulkan:x was accepted")
	}
	g := gpuOrSkip(t)
	d, line, err := Choose("auto")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("auto: %s", line)
	if g.Info().Type == vk.DeviceCPU {
		if d != (cpu.Device{}) || !strings.Contains(line, g.Info().Name) {
			t.Errorf("auto with only %s: %v %q, want the CPU and the reason", g.Info().Name, d, line)
		}
	}
	d, line, err = Choose("vulkan:0")
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := d.(Fit); !ok || f.Rest != (cpu.Device{}) || !strings.HasPrefix(line, "vulkan:0 ") {
		t.Errorf("vulkan:0: %#v %q", d, line)
	} else {
		f.GPU.Close()
	}
	if _, _, err := Choose("vulkan:99"); err == nil || !strings.Contains(err.Error(), "vulkan:99") {
		t.Errorf("vulkan:99: %v", err)
	}
}

// TestChooseWithoutLoader runs auto and vulkan in a process that cannot
// find the Vulkan loader: auto falls back to the CPU saying why in one
// line; vulkan is an error that says the loader is missing.
func TestChooseWithoutLoader(t *testing.T) {
	if os.Getenv("SHOAL_CHOOSE_CHILD") != "" {
		d, line, err := Choose("auto")
		if err != nil || d != (cpu.Device{}) || !strings.Contains(line, "no Vulkan loader") || strings.Contains(line, "\n") {
			t.Fatalf("auto without a loader: %v %q %v", d, line, err)
		}
		if _, _, err := Choose("vulkan"); err == nil || !strings.Contains(err.Error(), "no Vulkan loader") {
			t.Fatalf("vulkan without a loader: %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestChooseWithoutLoader$", "-test.v")
	// two places to look, both empty: still one line
	cmd.Env = append(os.Environ(), "SHOAL_CHOOSE_CHILD=1", "SHOAL_VULKAN_LIB=/nonexistent/libvulkan.so.1"+string(os.PathListSeparator)+"/nowhere/libvulkan.so")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
