package node

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/transport"
)

// TestLocalModelRefusesSpecialFiles: an agent's --model that names a FIFO
// (which a plain open would wait on for a writer forever) or a directory
// is refused within a second, with an error that says what the path is.
func TestLocalModelRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.gguf")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	for what, path := range map[string]string{"a named pipe": fifo, "a directory": dir} {
		a := &Agent{cfg: Config{Models: []ModelConfig{{Path: path}}}}
		err := withinSeconds(t, 1, "--model "+what, func() error { _, err := a.localRequests(); return err })
		if err == nil || !strings.Contains(err.Error(), what) {
			t.Fatalf("--model %s: %v, want an error that says it is %s", what, err, what)
		}
	}
}

func mustCA(t *testing.T) *transport.CA {
	t.Helper()
	ca, err := transport.DeriveCA("limits-test-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// bodyTestServer serves newHTTPServer with the given body timeout over
// HTTP/1.1 (tls false) or HTTP/2 over TLS: POST /read reads the body and
// answers its length; /stream answers ten SSE events 100 ms apart after
// reading the body, counting requests whose context ended early.
func bodyTestServer(t *testing.T, timeout time.Duration, tls bool) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var cut atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d", len(b))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 10 {
			select {
			case <-r.Context().Done():
				cut.Add(1)
				return
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			_ = http.NewResponseController(w).Flush()
		}
	})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = newHTTPServer(mux, timeout, zap.NewNop())
	if tls {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &cut
}

// TestHTTPBodyTimeout: a request body that trickles (a byte every 100 ms)
// gets its connection closed once the body timeout (300 ms here; a
// minute in an agent) passes, over HTTP/1.1 and HTTP/2; a body sent at
// once is read, and an SSE answer that streams for three times the body
// timeout after it is neither cut nor has its context ended.
func TestHTTPBodyTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	h1, cut1 := bodyTestServer(t, timeout, false)

	// HTTP/1.1 over a raw connection: headers, then a byte at a time.
	conn, err := net.Dial("tcp", h1.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t0 := time.Now()
	if _, err := fmt.Fprintf(conn, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, conn) // until the server closes it
		closed <- time.Since(t0)
	}()
	var took time.Duration
trickle:
	for i := 0; ; i++ {
		select {
		case took = <-closed:
			break trickle
		case <-time.After(100 * time.Millisecond):
		}
		_, _ = conn.Write([]byte{'x'})
		if i == 100 {
			t.Fatal("a body trickled for 10 s: the connection is still open")
		}
	}
	t.Logf("HTTP/1.1: the connection of a trickled body closed after %v (timeout %v)", took.Round(time.Millisecond), timeout)

	// HTTP/2: the trickled request fails, the client does not wait on.
	h2, cut2 := bodyTestServer(t, timeout, true)
	pr, pw := io.Pipe()
	go func() {
		for range 100 {
			if _, err := pw.Write([]byte{'x'}); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	defer pw.Close()
	req, _ := http.NewRequest(http.MethodPost, h2.URL+"/read", pr)
	t0 = time.Now()
	err = withinSeconds(t, 5, "an HTTP/2 trickled body", func() error {
		resp, err := h2.Client().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.ProtoMajor != 2 {
			t.Errorf("protocol %s, want HTTP/2", resp.Proto)
		}
		if resp.StatusCode == http.StatusOK {
			return fmt.Errorf("answered %s", b)
		}
		return nil
	})
	if err != nil && !strings.Contains(err.Error(), "stream error") && !strings.Contains(err.Error(), "closed") {
		t.Fatalf("HTTP/2 trickled body: %v", err)
	}
	t.Logf("HTTP/2: a trickled body refused after %v (%v)", time.Since(t0).Round(time.Millisecond), err)

	for _, srv := range []*httptest.Server{h1, h2} {
		// A body sent at once is read.
		resp, err := srv.Client().Post(srv.URL+"/read", "text/plain", strings.NewReader(strings.Repeat("y", 1<<16)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "65536" {
			t.Fatalf("a whole body: %d %s", resp.StatusCode, b)
		}
		// An answer streamed for 1 s after its body.
		t0 := time.Now()
		resp, err = srv.Client().Post(srv.URL+"/stream", "application/json", strings.NewReader(`{"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || strings.Count(string(b), "data: ") != 10 {
			t.Fatalf("%s stream: %v after %d events", resp.Proto, err, strings.Count(string(b), "data: "))
		}
		t.Logf("%s: an answer streamed for %v after a %v body timeout, whole", resp.Proto, time.Since(t0).Round(time.Millisecond), timeout)
	}
	if cut1.Load()+cut2.Load() != 0 {
		t.Fatalf("%d streamed answers had their context ended", cut1.Load()+cut2.Load())
	}
}

// withinSeconds runs f and fails the test if it takes more than n seconds.
func withinSeconds(t *testing.T, n int, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Duration(n) * time.Second):
		t.Fatalf("%s still runs after %d s", what, n)
		return nil
	}
}
