package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

// frontServer serves the Forwarder f at an HTTP address; each request goes
// to the driver at addr.
func frontServer(t *testing.T, f *Forwarder, addr func() string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.send(w, r, forwardTarget{model: "m", name: "driver", addr: addr()}, b, streamed(b), openAIFail)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// sseLines posts body to url and returns the non-empty lines of the
// answer as they come, with the status; the channel closes at the end.
func sseLines(t *testing.T, url, body string) (int, string, <-chan string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1000)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				out <- sc.Text()
			}
		}
	}()
	return resp.StatusCode, resp.Header.Get("Content-Type"), out
}

func collect(t *testing.T, lines <-chan string, within time.Duration) []string {
	t.Helper()
	var got []string
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return got
			}
			got = append(got, l)
		case <-deadline:
			t.Fatalf("the stream did not end within %v: %q", within, got)
		}
	}
}

const streamBody = `{"model":"m","stream":true}`

// TestForwardKeepAliveBeforeAnswer: while the driver has not begun its
// answer (waiting for its engine, a replay), the forwarding agent sends the
// stream's head and keepalive comments; then the driver's events pass
// through. A stream the driver ends without [DONE] or an error event
// gets an error event. A driver that refuses after that (a 503 JSON error) ends the
// stream with its error as an event.
func TestForwardKeepAliveBeforeAnswer(t *testing.T) {
	frontEP, driverEP := endpointPair(t, time.Second)
	const interval = 100 * time.Millisecond
	NewForwarder(ForwarderConfig{Endpoint: driverEP, Log: zap.NewNop()}).ServeForwarded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(3 * interval)
		if r.URL.Path == "/v1/completions" {
			OpenAIError(w, http.StatusServiceUnavailable, "server_error", "model_not_ready", "the driver is not up")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"tok\":1}\n\n")
		if b, _ := io.ReadAll(r.Body); !strings.Contains(string(b), "unfinished") {
			fmt.Fprint(w, "data: [DONE]\n\n")
		}
	}))
	f := NewForwarder(ForwarderConfig{Self: "front", Endpoint: frontEP, Log: zap.NewNop(), KeepAlive: interval})
	front := frontServer(t, f, func() string { return driverEP.Addr().String() })

	status, ct, lines := sseLines(t, front.URL+"/v1/chat/completions", streamBody)
	got := collect(t, lines, 5*time.Second)
	if status != 200 || ct != "text/event-stream" || len(got) < 4 || got[0] != ": keepalive" || got[1] != ": keepalive" ||
		got[len(got)-2] != `data: {"tok":1}` || got[len(got)-1] != "data: [DONE]" {
		t.Fatalf("%d %s %q", status, ct, got)
	}

	status, _, lines = sseLines(t, front.URL+"/v1/completions", streamBody)
	got = collect(t, lines, 5*time.Second)
	last := got[len(got)-1]
	if status != 200 || got[0] != ": keepalive" || !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "the driver is not up") {
		t.Fatalf("refusal after the head: %d %q", status, got)
	}

	// A driver (of an older version) that ends the stream without [DONE]
	// or an error event: the client gets an error event.
	status, _, lines = sseLines(t, front.URL+"/v1/chat/completions", `{"model":"m","stream":true,"unfinished":true}`)
	got = collect(t, lines, 5*time.Second)
	last = got[len(got)-1]
	if status != 200 || got[len(got)-2] != `data: {"tok":1}` || !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "before the answer was complete") {
		t.Fatalf("unfinished stream: %d %q", status, got)
	}

	// Not streamed: no keepalive, the driver's answer as it is.
	resp, err := http.Post(front.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "the driver is not up") {
		t.Fatalf("not streamed: %d %s", resp.StatusCode, b)
	}
}

// udpProxy relays one client's datagrams to upstream and back; paused, it
// drops them all, as a stopped process (SIGSTOP) or a partition does.
type udpProxy struct {
	conn   *net.UDPConn
	paused atomic.Bool
}

func newUDPProxy(t *testing.T, upstream *net.UDPAddr) *udpProxy {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := net.DialUDP("udp", nil, upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); out.Close() })
	p := &udpProxy{conn: c}
	var client atomic.Pointer[net.UDPAddr]
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, a, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			client.Store(a)
			if !p.paused.Load() {
				_, _ = out.Write(buf[:n])
			}
		}
	}()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := out.Read(buf)
			if err != nil {
				return
			}
			if a := client.Load(); a != nil && !p.paused.Load() {
				_, _ = c.WriteToUDP(buf[:n], a)
			}
		}
	}()
	return p
}

func (p *udpProxy) addr() string { return p.conn.LocalAddr().String() }

// TestForwardedStreamCutByDriver: a driver that dies mid-stream (its
// endpoint closes, which its peers learn at once) or stops answering (its packets stop: a paused process
// or a partition) ends the forwarded stream with an error event, never a
// silent end; while it is silent the client gets keepalives. A cut answer
// that is not streamed is a 502 or 504 OpenAI error, not a truncated 200.
func TestForwardedStreamCutByDriver(t *testing.T) {
	for _, fault := range []string{"endpoint closed", "paused", "not streamed"} {
		t.Run(fault, func(t *testing.T) {
			frontEP, driverEP := endpointPair(t, time.Second)
			proxy := newUDPProxy(t, driverEP.Addr())
			wrote := make(chan struct{})
			NewForwarder(ForwarderConfig{Endpoint: driverEP, Log: zap.NewNop()}).ServeForwarded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if fault == "not streamed" {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(200)
					fmt.Fprint(w, `{"id":"cmpl-1","choices":[`)
				} else {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: {\"tok\":1}\n\n")
				}
				close(wrote)
				<-r.Context().Done() // the rest never comes
			}))
			const interval = 100 * time.Millisecond
			f := NewForwarder(ForwarderConfig{Self: "front", Endpoint: frontEP, Log: zap.NewNop(), KeepAlive: interval})
			front := frontServer(t, f, proxy.addr)
			go func() {
				<-wrote
				time.Sleep(50 * time.Millisecond) // the first event is on its way
				if fault == "paused" {
					proxy.paused.Store(true)
				} else {
					driverEP.Close()
				}
			}()
			start := time.Now()
			if fault == "not streamed" {
				resp, err := http.Post(front.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m"}`))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if (resp.StatusCode != 502 && resp.StatusCode != 504) || !strings.Contains(string(b), `"type":"server_error"`) || !strings.Contains(string(b), "stopped answering") {
					t.Fatalf("cut answer: %d %s", resp.StatusCode, b)
				}
				return
			}
			status, _, lines := sseLines(t, front.URL+"/v1/chat/completions", streamBody)
			got := collect(t, lines, 8*time.Second)
			t.Logf("%s: ended after %v: %q", fault, time.Since(start).Round(time.Millisecond), got)
			last := got[len(got)-1]
			// Keepalives may come first on a loaded host (the interval is
			// short): the first event is the driver's token.
			first := ""
			for _, l := range got {
				if l != ": keepalive" {
					first = l
					break
				}
			}
			if status != 200 || first != `data: {"tok":1}` || !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "stopped answering") {
				t.Fatalf("%d %q", status, got)
			}
			if fault == "endpoint closed" && strings.Contains(last, "no recent network activity") {
				t.Fatalf("a driver's shutdown was noticed only by the idle timeout: %q", last)
			}
			if fault == "paused" {
				i := slices.Index(got, first)
				if i+1 >= len(got) || got[i+1] != ": keepalive" {
					t.Fatalf("no keepalive while the driver was silent: %q", got)
				}
				if d := time.Since(start); d > 5*time.Second {
					t.Fatalf("a silent driver was noticed after %v", d)
				}
			}
		})
	}
}
