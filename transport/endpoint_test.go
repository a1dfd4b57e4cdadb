package transport

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

const testSecret = "test-secret-0123456789"

func newEndpoint(t *testing.T, ca *CA, id, role string) *Endpoint {
	t.Helper()
	ident, err := SelfIssue(ca, id, role)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := Listen(Config{Bind: "127.0.0.1:0", Identity: ident, HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

func echo(s *Stream) {
	defer s.Close()
	b, err := ReadFrame(s, 1024)
	if err != nil {
		return
	}
	_ = WriteFrame(s, append([]byte(s.Peer.ID+":"), b...))
}

func TestDeriveCAIsDeterministic(t *testing.T) {
	a, err := DeriveCA(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := DeriveCA(testSecret)
	if string(a.DER) != string(b.DER) {
		t.Fatal("same secret gave different CA certificates")
	}
	c, _ := DeriveCA(testSecret + "x")
	if CAHash(a.Cert) == CAHash(c.Cert) {
		t.Fatal("different secrets gave the same CA")
	}
	if _, err := DeriveCA("short"); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("short secret: %v", err)
	}
}

func TestMutualTLSStream(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "node-a", RoleServer)
	b := newEndpoint(t, ca, "node-b", RoleClient)
	a.Handle(KindProbe, echo)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ { // reuses one connection
		s, err := b.Dial(ctx, a.Addr().String(), KindProbe)
		if err != nil {
			t.Fatal(err)
		}
		if s.Peer.ID != "node-a" || s.Peer.Role != RoleServer {
			t.Fatalf("dialer sees peer %+v", s.Peer)
		}
		if err := WriteFrame(s, []byte("ping")); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFrame(s, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "node-b:ping" {
			t.Fatalf("got %q", got)
		}
		s.Close()
	}
	if n := len(b.conns); n != 1 {
		t.Fatalf("%d cached connections, want 1", n)
	}
}

func TestRefusesPeerFromAnotherCA(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	other, _ := DeriveCA("another-secret-0123456789")
	a := newEndpoint(t, ca, "a", RoleServer)
	a.Handle(KindRPC, echo)
	x := newEndpoint(t, other, "intruder", RoleServer)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := x.Dial(ctx, a.Addr().String(), KindRPC)
	if err == nil {
		// TLS 1.3: the client may finish before the server rejects its
		// certificate; the first read then fails.
		_ = WriteFrame(s, []byte("x"))
		_, err = ReadFrame(s, 1024)
	}
	if err == nil {
		t.Fatal("peer with a foreign certificate was served")
	}
	t.Logf("refused: %v", err)
}

func TestRefusesPeerWithoutCertificateExceptJoin(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	a.Handle(KindRaft, echo)
	a.Handle(KindJoin, echo)
	ctx := context.Background()

	// Join streams are allowed without a certificate.
	s, done, err := DialPinned(ctx, a.Addr().String(), CAHash(ca.Cert), KindJoin, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = WriteFrame(s, []byte("hi"))
	got, err := ReadFrame(s, 1024)
	if err != nil || string(got) != ":hi" {
		t.Fatalf("join stream: %q %v", got, err)
	}
	done()

	// Anything else is refused and the connection closed.
	s, done, err = DialPinned(ctx, a.Addr().String(), CAHash(ca.Cert), KindRaft, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	_ = s.SetDeadline(time.Now().Add(3 * time.Second))
	_ = WriteFrame(s, []byte("append entries"))
	_, err = ReadFrame(s, 1024)
	var appErr *quic.ApplicationError
	if !errors.As(err, &appErr) || appErr.ErrorCode != codeNoCertificate {
		t.Fatalf("raft stream without certificate: got %v, want certificate-required close", err)
	}
	if !strings.Contains(appErr.ErrorMessage, "certificate is required") {
		t.Fatalf("message %q", appErr.ErrorMessage)
	}
}

func TestPinnedDialRejectsWrongCA(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	other, _ := DeriveCA("another-secret-0123456789")
	a := newEndpoint(t, ca, "a", RoleServer)
	a.Handle(KindJoin, echo)
	_, _, err := DialPinned(context.Background(), a.Addr().String(), CAHash(other.Cert), KindJoin, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "does not match the CA hash") {
		t.Fatalf("got %v, want CA hash mismatch", err)
	}
}

func TestRaftKindNeedsServerRole(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	a.Handle(KindRaft, echo)
	c := newEndpoint(t, ca, "c", RoleClient)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.Dial(ctx, a.Addr().String(), KindRaft)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetDeadline(time.Now().Add(3 * time.Second))
	_ = WriteFrame(s, []byte("x"))
	if _, err := ReadFrame(s, 1024); err == nil || err == io.EOF {
		t.Fatalf("client role got a raft stream: %v", err)
	}
}

func TestRPC(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	b := newEndpoint(t, ca, "b", RoleServer)
	srv := NewRPCServer(a, KindRPC, 2*time.Second)
	srv.Register("Add", func(ctx context.Context, p Peer, body json.RawMessage) (any, error) {
		var in [2]int
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, Errorf(http.StatusBadRequest, "bad body")
		}
		if in[0] < 0 {
			return nil, Errorf(http.StatusConflict, "negative from %s", p.ID)
		}
		return in[0] + in[1], nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var sum int
	if err := Call(ctx, b, a.Addr().String(), KindRPC, "Add", [2]int{2, 3}, &sum); err != nil || sum != 5 {
		t.Fatalf("Add: %d %v", sum, err)
	}
	err := Call(ctx, b, a.Addr().String(), KindRPC, "Add", [2]int{-1, 3}, &sum)
	if StatusOf(err) != http.StatusConflict || err.Error() != "negative from b" {
		t.Fatalf("error: %v (%d)", err, StatusOf(err))
	}
	err = Call(ctx, b, a.Addr().String(), KindRPC, "Nope", nil, nil)
	if StatusOf(err) != http.StatusNotFound {
		t.Fatalf("unknown method: %v", err)
	}
}
