package sdnotify

import (
	"errors"
	"net"
	"os"
	"strconv"
	"time"
)

// Messages a service sends.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
	Watchdog = "WATCHDOG=1"
)

// Notify sends state (one or more "KEY=value" lines) to the socket in
// NOTIFY_SOCKET. It reports false, nil when there is no such socket.
func Notify(state string) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract namespace
	} else if path[0] != '/' {
		return false, errors.New("NOTIFY_SOCKET " + strconv.Quote(path) + ": want an absolute path or an @abstract name")
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, err
	}
	return true, nil
}

// WatchdogInterval is how often the service must send WATCHDOG=1: half of
// WATCHDOG_USEC, when that is set and WATCHDOG_PID (if set) names this
// process; 0 when no watchdog is asked for.
func WatchdogInterval() (time.Duration, error) {
	s := os.Getenv("WATCHDOG_USEC")
	if s == "" {
		return 0, nil
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" {
		pid, err := strconv.Atoi(p)
		if err != nil {
			return 0, errors.New("WATCHDOG_PID " + strconv.Quote(p) + ": not a number")
		}
		if pid != os.Getpid() {
			return 0, nil // the watchdog is another process's
		}
	}
	us, err := strconv.ParseUint(s, 10, 63)
	if err != nil || us == 0 {
		return 0, errors.New("WATCHDOG_USEC " + strconv.Quote(s) + ": want a positive number of microseconds")
	}
	return time.Duration(us) * time.Microsecond / 2, nil
}
