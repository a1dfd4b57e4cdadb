//go:build linux

package telemetry

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// unprivEnv marks the child process of TestAttachUnprivileged.
const unprivEnv = "SHOAL_TELEMETRY_UNPRIVILEGED_CHILD"

// TestAttachUnprivileged checks that Attach without privileges fails with
// ErrUnsupported (and os.ErrPermission), so the agent falls back. Without
// the privileges it checks directly; with them (root) it reruns itself in a
// copy of the test binary as user nobody (65534), which has no capabilities.
func TestAttachUnprivileged(t *testing.T) {
	if p, err := load(testPort); err == nil {
		p.Close()
		if os.Geteuid() != 0 {
			t.Skip("eBPF loads without root: this user holds CAP_BPF and CAP_NET_ADMIN")
		}
	} else {
		p, err := Attach(testPort, []string{"lo"})
		if err == nil {
			p.Close()
			t.Fatal("Attach succeeded where loading failed")
		}
		if !errors.Is(err, ErrUnsupported) || !errors.Is(err, os.ErrPermission) {
			t.Fatalf("Attach as uid %d: %v; want an error wrapping ErrUnsupported and os.ErrPermission", os.Geteuid(), err)
		}
		t.Logf("Attach as uid %d: %v", os.Geteuid(), err)
		if os.Getenv(unprivEnv) != "" {
			fmt.Println("UNPRIVILEGED-CHILD-OK")
		}
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("cannot find the test binary: %v", err)
	}
	dir, err := os.MkdirTemp("", "shoal-telemetry-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "telemetry.test")
	if err := copyFile(exe, bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestAttachUnprivileged$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), unprivEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	t.Logf("child as nobody:\n%s", out)
	if err != nil || !strings.Contains(string(out), "UNPRIVILEGED-CHILD-OK") {
		t.Fatalf("child as nobody: %v", err)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func TestUnsupportedMapping(t *testing.T) {
	for _, c := range []struct {
		err         error
		unsupported bool
		permission  bool
	}{
		{fmt.Errorf("load: %w", unix.EPERM), true, true},
		{fmt.Errorf("load: %w", unix.EACCES), true, true},
		{fmt.Errorf("attach: %w", ebpf.ErrNotSupported), true, false},
		{fmt.Errorf("load: %w", &ebpf.VerifierError{}), true, false},
		{fmt.Errorf("x: %w", errnoENOTSUPP), true, false},
		{unix.ENOSYS, true, false},
		{fmt.Errorf("%w: already", ErrUnsupported), true, false},
		{fmt.Errorf("no such device: %w", unix.ENODEV), false, false},
		{errors.New("other"), false, false},
	} {
		got := unsupported(c.err)
		if errors.Is(got, ErrUnsupported) != c.unsupported || errors.Is(got, os.ErrPermission) != c.permission || !errors.Is(got, c.err) {
			t.Errorf("unsupported(%v) = %v: ErrUnsupported %v (want %v), ErrPermission %v (want %v)",
				c.err, got, errors.Is(got, ErrUnsupported), c.unsupported, errors.Is(got, os.ErrPermission), c.permission)
		}
	}
	if unsupported(nil) != nil {
		t.Error("unsupported(nil) != nil")
	}
}
