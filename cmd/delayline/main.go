//go:build linux

package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sort"
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
	spin := flag.Duration("spin", 0, "the last part of each wait for a packet's due time spent polling the clock and the input on the line's core instead of sleeping (a timer's wake-up comes 40-50 µs late on a virtual machine); 0: sleep throughout")
	queue := flag.Int("queue", 1<<16, "packets held at most; more are dropped (counted)")
	offload := flag.Bool("offload", true, "take and give segmentation-offloaded packets (up to 64 KiB of TCP or UDP segments in one, with a virtio-net header), relayed as they are, so a bulk transfer costs the line a read and a write per 64 KiB rather than per 1.5 KB packet")
	flag.Parse()
	if err := run(*in, *out, *delay, *spin, *queue, *offload); err != nil {
		fmt.Fprintln(os.Stderr, "delayline:", err)
		os.Exit(1)
	}
}

type packet struct {
	due  int64 // CLOCK_MONOTONIC ns
	data []byte
}

// monotonic is CLOCK_MONOTONIC in ns.
func monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// run relays packets from inName to outName, each delay after it was read.
// One locked thread does everything: it polls the input with a timeout of
// the time left until the oldest packet is due (ppoll, nanosecond
// timeout, 1 µs timer slack), reads what arrived, and writes what is due.
// There is no hand-off between threads to wait for, which cost the
// earlier reader-goroutine-and-channel line 50-85 µs a packet.
func run(inName, outName string, delay, spin time.Duration, queue int, offload bool) error {
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
	infd, outfd := int(in.Fd()), int(out.Fd())
	if err := unix.SetNonblock(infd, true); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "delayline: %s -> %s, %v one way, offloads %#x\n", inName, outName, delay, inOff)

	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		stop.Store(true)
	}()

	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
	var (
		q                        []packet // in arrival order, so in due order
		free                     [][]byte
		dropped, packets, nbytes int64
		lates                    []time.Duration
		errs                     int
	)
	buf := make([]byte, 1<<17) // a 64 KiB offloaded packet and its header
	fds := []unix.PollFd{{Fd: int32(infd), Events: unix.POLLIN}}
	const idle = 100 * time.Millisecond // the longest wait: stop is checked after it
	start := time.Now()
	for !stop.Load() {
		now := monotonic()
		for len(q) > 0 && q[0].due <= now {
			p := q[0]
			q = q[1:]
			if _, err := unix.Write(outfd, p.data); err != nil && errs < 10 {
				errs++
				fmt.Fprintln(os.Stderr, "delayline: write:", err)
			}
			packets++
			nbytes += int64(len(p.data))
			if len(lates) < 1<<20 {
				lates = append(lates, time.Duration(monotonic()-p.due))
			}
			free = append(free, p.data[:0])
		}
		wait := idle.Nanoseconds()
		if len(q) > 0 {
			// The last spin of a wait is spent checking the clock and the
			// input instead of sleeping: a wake-up from ppoll's timer
			// comes tens of microseconds late on a virtual machine.
			wait = min(wait, q[0].due-monotonic()-spin.Nanoseconds())
		}
		if wait > 0 {
			ts := unix.NsecToTimespec(wait)
			fds[0].Revents = 0
			if _, err := unix.Ppoll(fds, &ts, nil); err != nil && err != unix.EINTR {
				return fmt.Errorf("ppoll: %w", err)
			}
			if fds[0].Revents&unix.POLLIN == 0 {
				continue
			}
		}
		// Read what arrived (a bounded batch, so due packets go out).
		for range 64 {
			n, err := unix.Read(infd, buf)
			if err == unix.EAGAIN || err == unix.EINTR {
				break
			}
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if len(q) >= queue {
				dropped++
				continue
			}
			var d []byte
			if k := len(free); k > 0 {
				d, free = free[k-1], free[:k-1]
			}
			q = append(q, packet{due: monotonic() + delay.Nanoseconds(), data: append(d, buf[:n]...)})
		}
	}
	el := time.Since(start).Seconds()
	sort.Slice(lates, func(i, j int) bool { return lates[i] < lates[j] })
	pct := func(f float64) time.Duration {
		if len(lates) == 0 {
			return 0
		}
		return lates[min(len(lates)-1, int(f*float64(len(lates))))]
	}
	fmt.Fprintf(os.Stderr, "delayline: %d packets, %.1f MB in %.0f s, %d dropped; overshoot p50 %v p99 %v\n",
		packets, float64(nbytes)/1e6, el, dropped, pct(0.5), pct(0.99))
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
