package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

type memSource map[string][]byte

func (m memSource) OpenWeights(sha string) (io.ReaderAt, int64, bool) {
	b, ok := m[sha]
	if !ok {
		return nil, 0, false
	}
	return bytes.NewReader(b), int64(len(b)), true
}

func weightsPair(t *testing.T, o WeightsOptions) (client, server *Endpoint, data []byte, sha string) {
	t.Helper()
	ca, _ := DeriveCA(testSecret)
	server = newEndpoint(t, ca, "srv", RoleServer)
	client = newEndpoint(t, ca, "cli", RoleClient)
	data = make([]byte, 3<<20+17)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	h := sha256.Sum256(data)
	sha = hex.EncodeToString(h[:])
	ServeWeights(server, memSource{sha: data}, o)
	return client, server, data, sha
}

func TestWeightsServesRanges(t *testing.T) {
	var served atomic.Int64 // added to by the server's stream goroutines
	client, server, data, sha := weightsPair(t, WeightsOptions{Served: func(p Peer, s string, n int64) { served.Add(n) }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ranges := []WeightRange{{0, 100}, {1 << 20, 2 << 20}, {int64(len(data)) - 5, 5}, {7, 0}}
	rc, err := client.FetchWeights(ctx, server.Addr().String(), sha, ranges)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for _, r := range ranges {
		want = append(want, data[r.Off:r.Off+r.N]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d (content differs)", len(got), len(want))
	}
	// io.ReadFull stops at the length; the trailer is checked with the last bytes.
	rc, err = client.FetchWeights(ctx, server.Addr().String(), sha, ranges[:1])
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if _, err := io.ReadFull(rc, buf); err != nil || !bytes.Equal(buf, data[:100]) {
		t.Fatalf("ReadFull: %v", err)
	}
	rc.Close()
	deadline := time.Now().Add(2 * time.Second)
	for served.Load() != int64(len(want))+100 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := served.Load(); n != int64(len(want))+100 {
		t.Errorf("server reports %d bytes served, want %d", n, len(want)+100)
	}
}

func TestWeightsRefusals(t *testing.T) {
	client, server, data, sha := weightsPair(t, WeightsOptions{MaxBytes: 1 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unknown := hex.EncodeToString(make([]byte, 32))
	size := int64(len(data))
	for _, c := range []struct {
		name   string
		sha    string
		ranges []WeightRange
		status byte
	}{
		{"unknown file", unknown, []WeightRange{{0, 10}}, WeightsUnknownFile},
		{"past the end", sha, []WeightRange{{size - 10, 11}}, WeightsBadRange},
		{"offset past the end", sha, []WeightRange{{size + 1, 0}}, WeightsBadRange},
		{"negative", sha, []WeightRange{{-1, 10}}, WeightsBadRange},
		{"over the limit", sha, []WeightRange{{0, 1 << 19}, {1 << 19, 1<<19 + 1}}, WeightsTooLarge},
	} {
		_, err := client.FetchWeights(ctx, server.Addr().String(), c.sha, c.ranges)
		var we *WeightsError
		if !errors.As(err, &we) || we.Status != c.status {
			t.Errorf("%s: %v, want status %d", c.name, err, c.status)
		}
	}
	if _, err := client.FetchWeights(ctx, server.Addr().String(), "zz", []WeightRange{{0, 1}}); err == nil {
		t.Error("a malformed sha256 was sent")
	}
}

func TestWeightsRefusesPeerFromAnotherCA(t *testing.T) {
	_, server, _, sha := weightsPair(t, WeightsOptions{})
	other, _ := DeriveCA("another-secret-0123456789")
	intruder := newEndpoint(t, other, "intruder", RoleServer)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc, err := intruder.FetchWeights(ctx, server.Addr().String(), sha, []WeightRange{{0, 10}})
	if err == nil {
		b, rerr := io.ReadAll(rc)
		t.Fatalf("a peer from another CA got %d bytes (%v)", len(b), rerr)
	}
}

// partialReader holds only [0,held) of its file.
type partialReader struct {
	*bytes.Reader
	held int64
}

func (p partialReader) Holds(off, n int64) bool { return off >= 0 && off+n <= p.held }

type partialSource struct {
	sha  string
	data []byte
}

func (s partialSource) OpenWeights(sha string) (io.ReaderAt, int64, bool) {
	if sha != s.sha {
		return nil, 0, false
	}
	return partialReader{bytes.NewReader(s.data), 1 << 20}, int64(len(s.data)), true
}

// A node holding some ranges of a file (its shards) serves those and
// refuses the others as not held.
func TestWeightsPartialSource(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	server := newEndpoint(t, ca, "srv", RoleServer)
	client := newEndpoint(t, ca, "cli", RoleClient)
	data := bytes.Repeat([]byte("shard"), 1<<20)
	h := sha256.Sum256(data)
	sha := hex.EncodeToString(h[:])
	ServeWeights(server, partialSource{sha, data}, WeightsOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := client.FetchWeights(ctx, server.Addr().String(), sha, []WeightRange{{10, 1000}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data[10:1010]) {
		t.Fatalf("held range: %v", err)
	}
	_, err = client.FetchWeights(ctx, server.Addr().String(), sha, []WeightRange{{10, 1000}, {1<<20 - 1, 2}})
	var we *WeightsError
	if !errors.As(err, &we) || we.Status != WeightsNotHeld {
		t.Fatalf("a range not held: %v", err)
	}
}
