package transport

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"
)

// TestForwardStreamsAnswer: the request head and body arrive whole, and
// each write of the handler reaches the caller before the next one is made.
func TestForwardStreamsAnswer(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "driver", RoleServer)
	cli := newEndpoint(t, ca, "front", RoleClient)
	next := make(chan struct{})
	ServeForward(srv, func(ctx context.Context, p Peer, head ForwardHead, body []byte, w *ForwardWriter) {
		if p.ID != "front" || head.Method != "POST" || head.Path != "/v1/completions" || head.Model != "tiny" ||
			head.Header["Authorization"][0] != "Bearer k" || string(body) != `{"model":"tiny"}` {
			_ = w.WriteHead(ForwardReply{Status: 400})
			return
		}
		_ = w.WriteHead(ForwardReply{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}})
		for _, ev := range []string{"data: 1\n\n", "data: 2\n\n"} {
			if _, err := w.Write([]byte(ev)); err != nil {
				return
			}
			<-next // the caller saw this event before the next is written
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	head := ForwardHead{Method: "POST", Path: "/v1/completions", Model: "tiny", Header: map[string][]string{"Authorization": {"Bearer k"}}}
	reply, body, err := Forward(ctx, cli, srv.Addr().String(), head, []byte(`{"model":"tiny"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	if reply.Status != 200 || reply.Header["Content-Type"][0] != "text/event-stream" {
		t.Fatalf("reply %+v", reply)
	}
	for _, want := range []string{"data: 1\n\n", "data: 2\n\n"} {
		got, err := body.Next()
		if err != nil || string(got) != want {
			t.Fatalf("chunk %q %v, want %q", got, err, want)
		}
		next <- struct{}{}
	}
	if got, err := body.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last chunk: %q %v, want EOF", got, err)
	}
}

// TestForwardCutAndCanceled: a server that goes away cuts the answer with
// an error (not EOF); a caller that gives up ends the handler's context.
func TestForwardCutAndCanceled(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "driver", RoleServer)
	cli := newEndpoint(t, ca, "front", RoleClient)
	ended, fail := make(chan struct{}), make(chan struct{})
	ServeForward(srv, func(ctx context.Context, p Peer, head ForwardHead, body []byte, w *ForwardWriter) {
		_ = w.WriteHead(ForwardReply{Status: 200})
		_, _ = w.Write([]byte("partial"))
		if head.Path == "/panic" {
			<-fail
			panic("handler bug")
		}
		<-ctx.Done()
		close(ended)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, body, err := Forward(ctx, cli, srv.Addr().String(), ForwardHead{Method: "POST", Path: "/panic"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := body.Next(); err != nil || string(got) != "partial" {
		t.Fatalf("first chunk %q %v", got, err)
	}
	close(fail)
	if _, err := body.Next(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("a failed handler ended the answer with %v, want a reset", err)
	}
	body.Close()

	cctx, ccancel := context.WithCancel(ctx)
	_, body, err = Forward(cctx, cli, srv.Addr().String(), ForwardHead{Method: "POST", Path: "/wait"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	ccancel()
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Fatal("the handler's context did not end when the caller gave up")
	}

	// A server gone without a word is noticed by the connection's idle
	// timeout, or the caller's deadline if that comes first.
	srv.Close()
	dctx, dcancel := context.WithTimeout(ctx, time.Second)
	defer dcancel()
	if _, _, err := Forward(dctx, cli, srv.Addr().String(), ForwardHead{Method: "POST", Path: "/x"}, nil); err == nil {
		t.Fatal("forward to a closed endpoint succeeded")
	}
}

// TestForwardEndFrame: an answer is whole only when its end frame came: a
// server whose stream ends (FIN) before it cuts the answer with
// ErrForwardCut, not EOF; a server of the version before end frames,
// which says nothing of them in its head, still ends its answer with a FIN.
func TestForwardEndFrame(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "driver", RoleServer)
	cli := newEndpoint(t, ca, "front", RoleClient)
	srv.Handle(KindForward, func(s *Stream) {
		defer s.Close()
		hb, _ := ReadFrame(s, maxForwardHead)
		_, _ = ReadFrame(s, MaxForwardBody)
		var head ForwardHead
		_ = json.Unmarshal(hb, &head)
		reply := `{"status":200,"end":true}`
		if head.Path == "/old" {
			reply = `{"status":200}`
		}
		_ = WriteFrame(s, []byte(reply))
		_ = WriteFrame(s, []byte("partial"))
		// FIN without the end frame, as a dying handler's stream closes.
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for path, want := range map[string]error{"/new": ErrForwardCut, "/old": io.EOF} {
		reply, body, err := Forward(ctx, cli, srv.Addr().String(), ForwardHead{Method: "POST", Path: path}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := body.Next(); err != nil || string(got) != "partial" {
			t.Fatalf("%s: first chunk %q %v", path, got, err)
		}
		if _, err := body.Next(); !errors.Is(err, want) {
			t.Fatalf("%s (end %v): after the FIN %v, want %v", path, reply.End, err, want)
		}
		body.Close()
	}
}
