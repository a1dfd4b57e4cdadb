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
	offload := flag.Bool("offload", true, "take and give segmentation-offloaded packets (up to 64 KiB of TCP or UDP segments in one, with a virtio-net header), relayed as they are, so a bulk transfer costs the line a read and a write per 64 KiB rather than per 1.5 KB packet")
	flag.Parse()
	if err := run(*in, *out, *delay, *queue, *offload); err != nil {
		fmt.Fprintln(os.Stderr, "delayline:", err)
		os.Exit(1)
	}
}

type packet struct {
	due  time.Time
	data []byte
}

func run(inName, outName string, delay time.Duration, queue int, offload bool) error {
	in, inOff, err := openTUN(inName, offload)
	if err != nil {
		return err
	}
	defer in.Close()
	out, outOff, err := openTUN(outName, offload)
	if err != nil {
		return err
	}
	defer out.Close()
	if inOff != outOff {
		// Both ends must carry the same header: relay plain packets.
		return fmt.Errorf("%s takes offloads %#x, %s %#x: run with --offload=false", inName, inOff, outName, outOff)
	}
	fmt.Fprintf(os.Stderr, "delayline: %s -> %s, %v one way, offloads %#x\n", inName, outName, delay, inOff)

	q := make(chan packet, queue)
	var dropped, packets, bytes atomic.Int64
	var mu sync.Mutex
	var lates []time.Duration
	start := time.Now()
	go func() {
		buf := make([]byte, 1<<17) // a 64 KiB offloaded packet and its header
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

// Offloads a TUN device may take (linux/if_tun.h; USO since Linux 6.2).
const (
	tunCSUM = 0x01
	tunTSO4 = 0x02
	tunTSO6 = 0x04
	tunUSO4 = 0x20
	tunUSO6 = 0x40
)

// openTUN creates (or attaches to) the TUN device name, without packet
// information headers. With offload, every packet carries a virtio-net
// header and may be a segmentation-offloaded run of TCP or UDP segments:
// it tries checksum, TSO and USO, then checksum and TSO, and returns the
// offloads it set (0: plain packets, no header).
func openTUN(name string, offload bool) (*os.File, int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:unix.IFNAMSIZ-1], name)
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if offload {
		flags |= unix.IFF_VNET_HDR
	}
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = flags
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("TUNSETIFF %s: %w", name, errno)
	}
	set := 0
	if offload {
		for _, o := range []int{tunCSUM | tunTSO4 | tunTSO6 | tunUSO4 | tunUSO6, tunCSUM | tunTSO4 | tunTSO6} {
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETOFFLOAD, uintptr(o)); errno == 0 {
				set = o
				break
			}
		}
	}
	return os.NewFile(uintptr(fd), name), set, nil
}
