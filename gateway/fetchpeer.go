package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"shoal/transport"
)

// maxPeerAnswer bounds what FetchPeer reads.
const maxPeerAnswer = 4 << 20

// FetchPeer asks agent node for path with a GET over the node transport,
// as a forwarded request (the peer answers only what forwardable lets
// peers pass, with the certificate as the credential), and returns the
// body of a 200 answer.
func (f *Forwarder) FetchPeer(ctx context.Context, node, path string) ([]byte, error) {
	addr := f.rpcAddr(node)
	if addr == "" {
		return nil, errors.New("no live address")
	}
	reply, body, err := transport.Forward(ctx, f.cfg.Endpoint, addr, transport.ForwardHead{Method: http.MethodGet, Path: path}, nil)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	var out []byte
	for {
		chunk, err := body.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if out = append(out, chunk...); len(out) > maxPeerAnswer {
			return nil, fmt.Errorf("answer over %d bytes", maxPeerAnswer)
		}
	}
	if reply.Status != http.StatusOK {
		return nil, fmt.Errorf("status %d: %.200s", reply.Status, out)
	}
	return out, nil
}
