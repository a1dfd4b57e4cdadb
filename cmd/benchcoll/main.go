package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"shoal/transport"
)

// result is one row: a size through one path.
type result struct {
	Floats int     `json:"floats"`
	DType  string  `json:"dtype"`
	Path   string  `json:"path"` // quic or direct
	Calls  int     `json:"calls"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	Direct int     `json:"direct_peers"`
	// The link's round trip of a small UDP datagram (rank 0 to rank 1 and
	// back), the floor of any call.
	PingMinUS float64 `json:"ping_min_us"`
	PingAvgUS float64 `json:"ping_avg_us"`
}

func main() {
	var (
		bind    = flag.String("bind", "", "this member's address, host:port (UDP for QUIC, TCP for direct links)")
		members = flag.String("members", "", "every member's address in rank order, comma-separated")
		rank    = flag.Int("rank", 0, "this member's index in --members")
		secret  = flag.String("secret", "", "the secret every member derives the test CA from (16 characters or more)")
		floats  = flag.String("floats", "2048,65536,1048576", "vector sizes, comma-separated")
		dtype   = flag.String("dtype", "f16", "wire dtype: f32, f16 or q8_0")
		calls   = flag.Int("calls", 2000, "timed calls per size and path (a tenth of it for vectors over 64 Ki values)")
		asJSON  = flag.Bool("json", false, "print JSON lines instead of a table")
		poll    = flag.Duration("poll", 0, "how long a call polls a direct link before it parks (0: transport.DefaultPoll; negative: never)")
	)
	flag.Parse()
	if err := run(*bind, strings.Split(*members, ","), *rank, *secret, *floats, *dtype, *calls, *poll, *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, "benchcoll:", err)
		os.Exit(1)
	}
}

func run(bind string, members []string, rank int, secret, floats, dtype string, calls int, poll time.Duration, asJSON bool) error {
	dt, err := transport.ParseDType(dtype)
	if err != nil {
		return err
	}
	var sizes []int
	for _, s := range strings.Split(floats, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("--floats: %q", s)
		}
		sizes = append(sizes, n)
	}
	ca, err := transport.DeriveCA(secret)
	if err != nil {
		return err
	}
	id, err := transport.SelfIssue(ca, fmt.Sprintf("member-%d", rank), transport.RoleServer)
	if err != nil {
		return err
	}
	ep, err := transport.Listen(transport.Config{Bind: bind, Identity: id})
	if err != nil {
		return err
	}
	defer ep.Close()
	pmin, pavg, err := ping(bind, members, rank)
	if err != nil {
		return err
	}
	if !asJSON && rank == 0 {
		fmt.Printf("UDP round trip to rank 1: min %.1f µs, mean %.1f µs\n", pmin, pavg)
		fmt.Printf("%-9s %-5s %-7s %6s %10s %10s %10s\n", "floats", "dtype", "path", "calls", "mean µs", "p50 µs", "p99 µs")
	}
	for _, n := range sizes {
		k := calls
		if n > 64<<10 {
			k = max(calls/10, 20)
		}
		for _, direct := range []bool{false, true} {
			path := map[bool]string{false: "quic", true: "direct"}[direct]
			g, err := transport.NewGroup(ep, transport.GroupConfig{
				ID: fmt.Sprintf("%s-%d", path, n), Members: members, Rank: rank, DType: dt,
				NoDirect: !direct, Timeout: time.Minute, Poll: poll,
			})
			if err != nil {
				return err
			}
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i%7) / 8
			}
			// Warm up: the first call waits for every member and opens the
			// streams, the second the direct links.
			for range 20 {
				if err := g.AllReduceSum(x); err != nil {
					return err
				}
			}
			lat := make([]time.Duration, k)
			start := time.Now()
			for i := range k {
				t0 := time.Now()
				if err := g.AllReduceSum(x); err != nil {
					return err
				}
				lat[i] = time.Since(t0)
			}
			total := time.Since(start)
			slices.Sort(lat)
			r := result{Floats: n, DType: dt.String(), Path: path, Calls: k,
				MeanUS: float64(total.Nanoseconds()) / float64(k) / 1e3,
				P50US:  float64(lat[k/2].Nanoseconds()) / 1e3, P99US: float64(lat[k*99/100].Nanoseconds()) / 1e3,
				Direct: g.Direct(), PingMinUS: pmin, PingAvgUS: pavg}
			// Every member finishes the size before the next begins.
			if err := g.AllReduceSum(make([]float32, 1)); err != nil {
				return err
			}
			_ = g.Close()
			if rank != 0 {
				continue
			}
			if asJSON {
				b, _ := json.Marshal(r)
				fmt.Println(string(b))
			} else {
				fmt.Printf("%-9d %-5s %-7s %6d %10.1f %10.1f %10.1f\n", r.Floats, r.DType, r.Path, r.Calls, r.MeanUS, r.P50US, r.P99US)
			}
		}
	}
	return nil
}

// ping measures the round trip of a 64-byte UDP datagram between ranks 0
// and 1 on the port after the members' own: rank 1 echoes pings until
// rank 0 sends its last one. Other ranks skip it.
func ping(bind string, members []string, rank int) (minUS, avgUS float64, err error) {
	if rank > 1 || len(members) < 2 {
		return 0, 0, nil
	}
	port := func(addr string) (*net.UDPAddr, error) {
		ua, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return nil, err
		}
		ua.Port++
		return ua, nil
	}
	self, err := port(bind)
	if err != nil {
		return 0, 0, err
	}
	conn, err := net.ListenUDP("udp", self)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	const n = 300
	buf := make([]byte, 64)
	if rank == 1 {
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
		for {
			k, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return 0, 0, err
			}
			if _, err := conn.WriteToUDP(buf[:k], from); err != nil {
				return 0, 0, err
			}
			if k > 0 && buf[0] == 1 {
				return 0, 0, nil
			}
		}
	}
	peer, err := port(members[1])
	if err != nil {
		return 0, 0, err
	}
	var rtts []time.Duration
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; len(rtts) < n && time.Now().Before(deadline); i++ {
		buf[0] = 0
		if len(rtts) == n-1 {
			buf[0] = 1 // the last one: rank 1 stops echoing
		}
		t0 := time.Now()
		if _, err := conn.WriteToUDP(buf, peer); err != nil {
			return 0, 0, err
		}
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, _, err := conn.ReadFromUDP(buf); err != nil {
			continue // rank 1 not up yet, or a datagram lost: send again
		}
		rtts = append(rtts, time.Since(t0))
	}
	if len(rtts) < n {
		return 0, 0, fmt.Errorf("ping: %d of %d answers", len(rtts), n)
	}
	slices.Sort(rtts)
	var sum time.Duration
	for _, r := range rtts {
		sum += r
	}
	return float64(rtts[0].Nanoseconds()) / 1e3, float64(sum.Nanoseconds()) / n / 1e3, nil
}
