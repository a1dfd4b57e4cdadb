//go:build linux

package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	in := flag.String("in", "dlin", "TUN device the packets to delay are routed into")
	out := flag.String("out", "dlout", "TUN device the delayed packets leave by")
	delay := flag.Duration("delay", 100*time.Microsecond, "one-way delay added to every packet")
	queue := flag.Int("queue", 1<<16, "packets held at most; more are dropped (counted)")
	flag.Parse()
	if err := run(*in, *out, *delay, *queue); err != nil {
		fmt.Fprintln(os.Stderr, "delayline:", err)
		os.Exit(1)
	}
}

type packet struct {
	due  time.Time
	data []byte
}

func run(inName, outName string, delay time.Duration, queue int) error {
	in, err := openTUN(inName)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := openTUN(outName)
	if err != nil {
		return err
	}
	defer out.Close()
	fmt.Fprintf(os.Stderr, "delayline: %s -> %s, %v one way\n", inName, outName, delay)

	q := make(chan packet, queue)
	var dropped, packets, bytes atomic.Int64
	var mu sync.Mutex
	var lates []time.Duration
	start := time.Now()
	go func() {
		buf := make([]byte, 1<<16)
		for {
			n, err := in.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) {
					fmt.Fprintln(os.Stderr, "delayline: read:", err)
				}
				close(q)
				return
			}
			p := packet{due: time.Now().Add(delay), data: append([]byte(nil), buf[:n]...)}
			select {
			case q <- p:
			default:
				dropped.Add(1)
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Go's timers wake the runtime with millisecond precision when it
		// is idle: this goroutine keeps a thread of its own and sleeps in
		// nanosleep with a timer slack of 1 us instead.
		runtime.LockOSThread()
		_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
		for p := range q {
			if wait := time.Until(p.due); wait > 0 {
				ts := unix.NsecToTimespec(wait.Nanoseconds())
				for unix.Nanosleep(&ts, &ts) == unix.EINTR {
				}
			}
			late := time.Since(p.due)
			if _, err := out.Write(p.data); err != nil {
				fmt.Fprintln(os.Stderr, "delayline: write:", err)
			}
			packets.Add(1)
			bytes.Add(int64(len(p.data)))
			mu.Lock()
			if len(lates) < 1<<20 {
				lates = append(lates, late)
			}
			mu.Unlock()
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case <-done:
	}
	el := time.Since(start).Seconds()
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(lates, func(i, j int) bool { return lates[i] < lates[j] })
	pct := func(f float64) time.Duration {
		if len(lates) == 0 {
			return 0
		}
		return lates[min(len(lates)-1, int(f*float64(len(lates))))]
	}
	fmt.Fprintf(os.Stderr, "delayline: %d packets, %.1f MB in %.0f s, %d dropped; overshoot p50 %v p99 %v\n",
		packets.Load(), float64(bytes.Load())/1e6, el, dropped.Load(), pct(0.5), pct(0.99))
	return nil
}

// openTUN creates (or attaches to) the TUN device name, without packet
// information headers.
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:unix.IFNAMSIZ-1], name)
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TUN | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, errno)
	}
	return os.NewFile(uintptr(fd), name), nil
}
