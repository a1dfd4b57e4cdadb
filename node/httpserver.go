package node

import (
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/internal/zapio"
)

// Timeouts of the agent's HTTP server.
const (
	// httpHeaderTimeout bounds reading a request's header.
	httpHeaderTimeout = 10 * time.Second
	// httpBodyTimeout bounds reading a request's body (Tuning.HTTPBody):
	// bodies are at most a few MiB (4 MiB for the OpenAI endpoint), so a
	// minute allows 560 kbit/s.
	httpBodyTimeout = time.Minute
	// httpIdleTimeout bounds a kept-alive connection between requests.
	httpIdleTimeout = 2 * time.Minute
)

// newHTTPServer is the agent's HTTP server for h. A request's header must
// arrive within httpHeaderTimeout and its body within bodyTimeout of the
// handler's start (bodyDeadline); the answer has no time limit, so a
// streamed (SSE) generation runs as long as it takes. The server sets no
// ReadTimeout, which would also end the request's context of an HTTP/1.1
// answer still streaming when it passes, and no WriteTimeout.
func newHTTPServer(h http.Handler, bodyTimeout time.Duration, log *zap.Logger) *http.Server {
	return &http.Server{Handler: bodyDeadline(h, bodyTimeout), ReadHeaderTimeout: httpHeaderTimeout, IdleTimeout: httpIdleTimeout,
		ErrorLog: zapio.StdLogger(log.Named("http"))}
}

// bodyDeadline gives a request with a body a read deadline d from now (on
// HTTP/1.1 the connection's, on HTTP/2 the stream's), lifted once the body
// has been read to its end: a client that trickles its body gets a read
// error in the handler after d and its connection is closed. A request
// passed on by a peer (no connection to set a deadline on) is served as
// it is.
func bodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		}
		h.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline when the body reaches its end. It
// keeps the deadline after any other error: the server then gives up on
// the rest of the body at once and closes the connection.
type deadlineBody struct {
	io.ReadCloser
	once sync.Once
	lift func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.lift)
	}
	return n, err
}
