package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// Probe protocol on a KindProbe stream: 9-byte requests, an op byte and a
// big-endian uint64.
//
//	'p' seq  ping; the server echoes the 9 bytes
//	'b' n    bulk; n bytes follow, the server answers 'a' n once all are read
//
// The stream ends with the client's FIN.
const (
	probePing = 'p'
	probeBulk = 'b'
	probeAck  = 'a'

	probePings = 7 // measured pings, after one warm-up

	// DefaultMaxProbeBytes bounds the bulk transfer a probe server accepts.
	DefaultMaxProbeBytes = 64 << 20
	probeIdle            = 10 * time.Second
)

// LinkProbe is what Probe measured on the link to a peer.
type LinkProbe struct {
	Addr   string
	RTT    time.Duration // median round trip of small pings
	RTTMin time.Duration
	RTTMax time.Duration
	Pings  int
	// Bulk transfer towards the peer: bytes sent and the time from the
	// first byte until the peer acknowledged the last one.
	Bytes   int64
	Elapsed time.Duration
	// Bandwidth in bytes per second (Bytes / Elapsed); 0 without bulk.
	Bandwidth float64
}

// ServeProbe answers link probes on ep, on QUIC streams and, from peers of
// protocol 4, on direct links (ProbeDirect). maxBytes bounds one bulk
// transfer (DefaultMaxProbeBytes when 0).
func ServeProbe(ep *Endpoint, maxBytes int64) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxProbeBytes
	}
	ep.direct.probeMax.Store(maxBytes)
	ep.Handle(KindProbe, func(s *Stream) {
		defer s.Close()
		if !serveProbe(s, maxBytes) {
			s.CancelRead(codeForbidden)
			s.CancelWrite(codeForbidden)
		}
	})
}

// probeConn is what a probe runs on: a QUIC stream or a direct link.
type probeConn interface {
	io.ReadWriter
	SetDeadline(time.Time) error
}

// serveProbe answers the requests on c until it ends; false when it ended
// on a request it refuses.
func serveProbe(c probeConn, maxBytes int64) bool {
	var req [9]byte
	for {
		_ = c.SetDeadline(time.Now().Add(probeIdle))
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return true
		}
		n := binary.BigEndian.Uint64(req[1:])
		switch req[0] {
		case probePing:
		case probeBulk:
			if n > uint64(maxBytes) {
				return false
			}
			if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
				return true
			}
			req[0] = probeAck
		default:
			return false
		}
		if _, err := c.Write(req[:]); err != nil {
			return true
		}
	}
}

var probeChunk = make([]byte, 64<<10)

// Probe measures the link to the endpoint at addr, which serves probes
// (ServeProbe): the median round trip of a few small pings, then the time
// to send bulk bytes (0 skips it). ctx bounds the whole probe.
func (e *Endpoint) Probe(ctx context.Context, addr string, bulk int64) (LinkProbe, error) {
	res := LinkProbe{Addr: addr}
	st, err := e.Dial(ctx, addr, KindProbe)
	if err != nil {
		return res, fmt.Errorf("probe %s: %w", addr, err)
	}
	defer st.Close()
	err = withDeadline(ctx, st.SetDeadline, func() error { return runProbe(st, bulk, 1, &res) })
	if err != nil {
		return res, fmt.Errorf("probe %s: %w", addr, err)
	}
	return res, nil
}

// ProbeDirect is Probe over a direct link, the path a tensor-parallel
// group's collectives take to a peer of protocol 4: TCP's bandwidth there
// is not QUIC's (QUIC's costs a machine's CPU more per byte). The bulk
// goes twice and the faster counts: a group's links are long-lived, and
// the first transfer of a new connection measures TCP's slow start more
// than the link. A peer that takes no direct links fails it.
func (e *Endpoint) ProbeDirect(ctx context.Context, addr string, bulk int64) (LinkProbe, error) {
	res := LinkProbe{Addr: addr}
	d, err := e.dialTLS(ctx, addr, e.direct.probe)
	if err != nil {
		return res, fmt.Errorf("direct probe %s: %w", addr, err)
	}
	defer d.Close()
	err = withDeadline(ctx, d.tls.SetDeadline, func() error { return runProbe(d.tls, bulk, 2, &res) })
	if err != nil {
		return res, fmt.Errorf("direct probe %s: %w", addr, err)
	}
	return res, nil
}

// runProbe is the client's side of a probe on c, into res: the bulk
// transfer rounds times, the fastest kept.
func runProbe(c probeConn, bulk int64, rounds int, res *LinkProbe) error {
	var req, resp [9]byte
	exchange := func(op byte, n uint64, body int64) (time.Duration, error) {
		req[0] = op
		binary.BigEndian.PutUint64(req[1:], n)
		start := time.Now()
		if _, err := c.Write(req[:]); err != nil {
			return 0, err
		}
		for body > 0 {
			k := min(body, int64(len(probeChunk)))
			if _, err := c.Write(probeChunk[:k]); err != nil {
				return 0, err
			}
			body -= k
		}
		if _, err := io.ReadFull(c, resp[:]); err != nil {
			return 0, err
		}
		want := req
		if op == probeBulk {
			want[0] = probeAck
		}
		if resp != want {
			return 0, errors.New("mismatched probe reply")
		}
		return time.Since(start), nil
	}
	rtts := make([]time.Duration, 0, probePings)
	for i := 0; i <= probePings; i++ {
		d, err := exchange(probePing, uint64(i), 0)
		if err != nil {
			return err
		}
		if i > 0 { // the first ping also opens the stream
			rtts = append(rtts, d)
		}
	}
	slices.Sort(rtts)
	res.RTT, res.RTTMin, res.RTTMax, res.Pings = rtts[len(rtts)/2], rtts[0], rtts[len(rtts)-1], len(rtts)
	for range rounds {
		if bulk <= 0 {
			break
		}
		d, err := exchange(probeBulk, uint64(bulk), bulk)
		if err != nil {
			return err
		}
		if res.Elapsed == 0 || d < res.Elapsed {
			res.Bytes, res.Elapsed = bulk, d
			res.Bandwidth = float64(bulk) / d.Seconds()
		}
	}
	return nil
}
