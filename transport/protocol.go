package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/quic-go/quic-go"

	"shoal/internal/version"
)

// The protocol of a connection is negotiated in its TLS handshake, through
// ALPN: a dialer offers "shoal/N" for every protocol of its window, newest
// first, and the listener picks the newest it also speaks. Every stream of
// the connection then speaks that protocol (Peer.Protocol), so a handler
// can tell what its peer reads. A build from before protocols were named
// offers and accepts only "shoal/1", which is protocol 1.
//
// When the windows do not meet, the handshake fails (TLS's
// no_application_protocol alert) and the dialer asks the listener's
// version over one more connection of ALPN "shoal/version", which every
// listener since protocol 2 answers without a certificate: the dialer's
// error (*version.Mismatch) names both sides.

const alpnPrefix = "shoal/"

// alpnFor lists the ALPN names of w's protocols, newest first.
func alpnFor(w version.Window) []string {
	var out []string
	for p := w.Max; p >= w.Min && p >= 1; p-- {
		out = append(out, alpnPrefix+strconv.Itoa(p))
	}
	return out
}

// protocolOf is the protocol an ALPN name names; 0 when it names none.
func protocolOf(alpn string) int {
	s, ok := strings.CutPrefix(alpn, alpnPrefix)
	if !ok {
		return 0
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 {
		return 0
	}
	return p
}

// alpnVersion is the ALPN of a connection that only asks the listener's
// version.
const alpnVersion = alpnPrefix + "version"

// listenTLS is base set up to negotiate w's protocols and to answer
// version queries; refused logs each dialer whose window misses w.
func listenTLS(base *tls.Config, w version.Window, refused func(offered []string)) *tls.Config {
	tc := base.Clone()
	tc.NextProtos = append(alpnFor(w), alpnVersion)
	tc.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		shoal := false
		for _, a := range hello.SupportedProtos {
			if p := protocolOf(a); w.Has(p) || a == alpnVersion {
				return nil, nil
			} else if p > 0 {
				shoal = true
			}
		}
		if shoal && refused != nil {
			refused(hello.SupportedProtos)
		}
		return nil, nil // the handshake fails for want of a shared protocol
	}
	return tc
}

// dialTLS is base set up to offer w's protocols.
func dialTLS(base *tls.Config, w version.Window) *tls.Config {
	tc := base.Clone()
	tc.NextProtos = alpnFor(w)
	return tc
}

// connProtocol is the protocol negotiated on conn.
func connProtocol(conn *quic.Conn) int {
	return protocolOf(conn.ConnectionState().TLS.NegotiatedProtocol)
}

// versionAnswer is what a listener answers a version query with: its
// version and window ("0.9.0+3f2a9c1e0b7d 1-2").
func versionAnswer(build string, w version.Window) string {
	return fmt.Sprintf("%s %d-%d", build, w.Min, w.Max)
}

// parseVersionAnswer reads versionAnswer's text.
func parseVersionAnswer(s string) (build string, w version.Window, ok bool) {
	i := strings.LastIndexByte(s, ' ')
	if i <= 0 {
		return "", w, false
	}
	if _, err := fmt.Sscanf(s[i+1:], "%d-%d", &w.Min, &w.Max); err != nil || w.Min < 1 || w.Max < w.Min {
		return "", w, false
	}
	return s[:i], w, true
}

// noSharedProtocol reports whether err is a handshake that failed for want
// of a shared ALPN protocol.
func noSharedProtocol(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) && te.ErrorCode == quic.TransportErrorCode(0x100+tlsAlertNoApplicationProtocol)
}

// tlsAlertNoApplicationProtocol is TLS's alert for a failed ALPN
// negotiation (RFC 7301).
const tlsAlertNoApplicationProtocol = 120

// askVersion asks the listener at addr its version over a connection of
// its own on tr, within timeout. ok is false when it does not answer (a
// build from before protocol 2).
func askVersion(ctx context.Context, tr *quic.Transport, addr string, timeout time.Duration) (build string, w version.Window, ok bool) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return "", w, false
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tc := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, NextProtos: []string{alpnVersion}} // #nosec G402 -- only a version string is read
	conn, err := tr.Dial(ctx, ua, tc, &quic.Config{HandshakeIdleTimeout: timeout})
	if err != nil {
		return "", w, false
	}
	defer conn.CloseWithError(codeOK, "")
	s, err := conn.AcceptUniStream(ctx)
	if err != nil {
		return "", w, false
	}
	b, err := io.ReadAll(io.LimitReader(s, 256))
	if err != nil {
		return "", w, false
	}
	return parseVersionAnswer(string(b))
}

// answerVersion answers a version query on conn and closes it.
func answerVersion(conn *quic.Conn, build string, w version.Window) {
	defer conn.CloseWithError(codeOK, "")
	s, err := conn.OpenUniStream()
	if err != nil {
		return
	}
	_, _ = s.Write([]byte(versionAnswer(build, w)))
	_ = s.Close()
	// Let the answer reach the dialer before the connection closes.
	select {
	case <-conn.Context().Done():
	case <-time.After(2 * time.Second):
	}
}

// mismatch is the error of a dial to addr that failed for want of a shared
// protocol: it asks the listener's version to name both sides.
func mismatch(ctx context.Context, tr *quic.Transport, addr string, local version.Window, build string, timeout time.Duration) error {
	m := &version.Mismatch{Local: local, LocalBuild: build, Peer: addr}
	if rb, rw, ok := askVersion(ctx, tr, addr, timeout); ok {
		m.RemoteBuild, m.Remote = rb, rw.Max
		m.RemoteMin = rw.Min
	}
	return m
}
