package sdnotify_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"shoal/internal/sdnotify"
)

// listen opens a datagram socket standing in for systemd's and points
// NOTIFY_SOCKET at it.
func listen(t *testing.T, abstract bool) *net.UnixConn {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify.sock")
	env := name
	if abstract {
		name = "\x00shoal-sdnotify-test-" + strconv.Itoa(os.Getpid())
		env = "@" + name[1:]
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", env)
	return c
}

func read(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotify(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		c := listen(t, abstract)
		sent, err := sdnotify.Notify(sdnotify.Ready + "\nSTATUS=serving")
		if err != nil || !sent {
			t.Fatalf("abstract=%v: sent %v, err %v", abstract, sent, err)
		}
		if got := read(t, c); got != "READY=1\nSTATUS=serving" {
			t.Fatalf("abstract=%v: got %q", abstract, got)
		}
	}
}

func TestNotifyWithoutSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := sdnotify.Notify(sdnotify.Ready); sent || err != nil {
		t.Fatalf("sent %v, err %v without NOTIFY_SOCKET", sent, err)
	}
	t.Setenv("NOTIFY_SOCKET", "relative/path")
	if _, err := sdnotify.Notify(sdnotify.Ready); err == nil {
		t.Fatal("a relative NOTIFY_SOCKET was taken")
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody-listens"))
	if _, err := sdnotify.Notify(sdnotify.Ready); err == nil {
		t.Fatal("no error when nobody listens")
	}
}

func TestWatchdogInterval(t *testing.T) {
	t.Setenv("WATCHDOG_PID", "")
	t.Setenv("WATCHDOG_USEC", "")
	if d, err := sdnotify.WatchdogInterval(); d != 0 || err != nil {
		t.Fatalf("no watchdog: %v %v", d, err)
	}
	t.Setenv("WATCHDOG_USEC", "30000000")
	if d, err := sdnotify.WatchdogInterval(); d != 15*time.Second || err != nil {
		t.Fatalf("30 s watchdog: ping every %v (%v), want 15s", d, err)
	}
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()+1))
	if d, err := sdnotify.WatchdogInterval(); d != 0 || err != nil {
		t.Fatalf("another process's watchdog: %v %v", d, err)
	}
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("WATCHDOG_USEC", "soon")
	if _, err := sdnotify.WatchdogInterval(); err == nil {
		t.Fatal("WATCHDOG_USEC=soon taken")
	}
}
