package catalog

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/engine/enginetest"
	"shoal/engine/synth"
	"shoal/shard"
	"shoal/transport"
)

const weightsSecret = "weights-test-secret-0123456789"

// udpRelay forwards datagrams between one client and a server and counts
// the UDP payload bytes each way: what the QUIC connection put on the
// wire, packet headers, TLS handshake and acknowledgements included.
type udpRelay struct {
	front  *net.UDPConn // the client talks to this
	back   *net.UDPConn // connected to the server
	mu     sync.Mutex
	client *net.UDPAddr
	up     atomic.Int64 // client to server
	down   atomic.Int64 // server to client
}

func newRelay(t *testing.T, server *net.UDPAddr) *udpRelay {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.DialUDP("udp", nil, server)
	if err != nil {
		t.Fatal(err)
	}
	r := &udpRelay{front: front, back: back}
	t.Cleanup(func() { front.Close(); back.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := front.ReadFromUDP(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.client = from
			r.mu.Unlock()
			r.up.Add(int64(n))
			_, _ = back.Write(buf[:n])
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := back.Read(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			c := r.client
			r.mu.Unlock()
			r.down.Add(int64(n))
			if c != nil {
				_, _ = front.WriteToUDP(buf[:n], c)
			}
		}
	}()
	return r
}

func (r *udpRelay) addr() string { return r.front.LocalAddr().String() }

type weightsFixture struct {
	path   string
	sha    string
	source *Catalog // serves the file: weights stream and Weights.Layout
	srcEP  *transport.Endpoint
	client *transport.Endpoint
	relay  *udpRelay
}

// newWeightsFixture writes a synth model, registers it with a minimal
// source agent and gives a second endpoint that reaches the source only
// through a counting relay.
func newWeightsFixture(t *testing.T, corrupt *corruptingSource) *weightsFixture {
	t.Helper()
	dir := t.TempDir()
	path := enginetest.Write(t, dir, synth.Spec{Arch: "llama", NEmbd: 512, NLayer: 6, NHead: 8, NHeadKV: 2, NFF: 1024, Type: "q8_0", Seed: 3, Name: "wt"})
	sha, err := shard.FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := transport.DeriveCA(weightsSecret)
	if err != nil {
		t.Fatal(err)
	}
	listen := func(id, role string) *transport.Endpoint {
		ident, err := transport.SelfIssue(ca, id, role)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		return ep
	}
	f := &weightsFixture{path: path, sha: sha, srcEP: listen("source", transport.RoleServer), client: listen("fetcher", transport.RoleClient)}
	c := &Catalog{name: "source", log: zap.NewNop()}
	c.files = openFileRegistry(dir, c.log)
	t.Cleanup(c.files.close)
	st, _ := os.Stat(path)
	if err := c.files.add(sha, path, st); err != nil {
		t.Fatal(err)
	}
	rpc := transport.NewRPCServer(f.srcEP, transport.KindRPC, 10*time.Second)
	rpc.Register(MethodLayout, c.serveLayout)
	var src transport.WeightSource = c.files
	if corrupt != nil {
		corrupt.inner = c.files
		src = corrupt
	}
	transport.ServeWeights(f.srcEP, src, transport.WeightsOptions{})
	f.source = c
	f.relay = newRelay(t, f.srcEP.Addr())
	return f
}

// tpShard is rank 1 of a 2-way TP group on layers [1,4): row slices and
// column slices (one short range per row of attn_output and ffn_down).
func (f *weightsFixture) tpShard() shard.ShardSpec {
	return shard.ShardSpec{Model: "wt", FileSHA: f.sha, Lo: 1, Hi: 4, TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: 512, FFNHi: 1024}
}

func within5(t *testing.T, what string, got, want int64) {
	t.Helper()
	d := float64(got-want) / float64(want)
	t.Logf("%s: %d bytes, shard %d bytes (%+.2f%%)", what, got, want, 100*d)
	if d < -0.05 || d > 0.05 {
		t.Errorf("%s: %d bytes, not within 5%% of the shard's %d", what, got, want)
	}
}

// sameShard checks an assembled shard against the one Open takes from the
// whole file.
func sameShard(t *testing.T, path, model string, spec shard.ShardSpec) {
	t.Helper()
	got, err := shard.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want, err := shard.Open(model, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("%d tensors, want %d", len(got.Tensors), len(want.Tensors))
	}
	for i := range want.Tensors {
		if got.Tensors[i].Name != want.Tensors[i].Name || !bytes.Equal(got.Tensors[i].Data, want.Tensors[i].Data) {
			t.Fatalf("tensor %s differs", want.Tensors[i].Name)
		}
	}
}

// A node without the file receives only its ranges from a peer: the bytes
// it receives on the wire (UDP payload from the peer: QUIC and TLS
// overhead and the layout answer included) and the bytes the peer read
// from its file are the shard's size within 5%. The acknowledgements and
// requests it sends are logged too.
func TestFetchShardFromPeer(t *testing.T) {
	f := newWeightsFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := f.tpShard()
	l, err := fetchLayout(ctx, f.client, f.relay.addr(), spec, 0)
	if err != nil {
		t.Fatal(err)
	}
	fileSize, _ := os.Stat(f.path)
	pf := &PeerFetcher{EP: f.client, Addr: f.relay.addr()}
	out := filepath.Join(t.TempDir(), "s.shard")
	t0 := time.Now()
	pr, err := shard.Assemble(ctx, out, l, pf, shard.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("assembled %d pieces (%d bytes of a %d-byte file) in %v", pr.Pieces, l.Bytes(), fileSize.Size(), time.Since(t0).Round(time.Millisecond))
	if float64(l.Bytes()) > 0.4*float64(fileSize.Size()) {
		t.Fatalf("the shard is %d bytes of a %d-byte file: not a partial shard", l.Bytes(), fileSize.Size())
	}
	within5(t, "received by the fetcher", pf.Received.Load(), l.Bytes())
	within5(t, "read from the peer's file", f.source.files.read.Load(), l.Bytes())
	within5(t, "UDP payload received from the peer", f.relay.down.Load(), l.Bytes())
	t.Logf("UDP payload sent to the peer (requests, acknowledgements): %d bytes; both ways %+.2f%% of the shard",
		f.relay.up.Load(), 100*float64(f.relay.up.Load()+f.relay.down.Load()-l.Bytes())/float64(l.Bytes()))
	sameShard(t, out, f.path, spec)
}

// An interrupted fetch resumes: the first assembly is cut off after about
// 40% of the bytes; the second fetches only the pieces the first did not
// complete, over the network.
func TestFetchShardResumes(t *testing.T) {
	f := newWeightsFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := f.tpShard()
	l, err := fetchLayout(ctx, f.client, f.relay.addr(), spec, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "s.shard")
	cut, stop := context.WithCancel(ctx)
	pf1 := &PeerFetcher{EP: f.client, Addr: f.relay.addr()}
	pr1, err := shard.Assemble(cut, out, l, pf1, shard.AssembleOptions{Parallel: 2, SyncBytes: 1, Progress: func(p shard.Progress) {
		if p.DoneBytes > l.Bytes()*4/10 {
			stop()
		}
	}})
	stop()
	if err == nil || pr1.Done == 0 || pr1.Done == pr1.Pieces {
		t.Fatalf("first run: %+v, %v; want an interrupted, partial assembly", pr1, err)
	}
	pf2 := &PeerFetcher{EP: f.client, Addr: f.relay.addr()}
	pr2, err := shard.Assemble(ctx, out, l, pf2, shard.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first run kept %d of %d pieces (%d of %d bytes); the second fetched %d bytes", pr1.Done, pr1.Pieces, pr1.DoneBytes, l.Bytes(), pf2.Received.Load())
	if pr2.Resumed != pr1.Done || pf2.Received.Load() != l.Bytes()-pr1.DoneBytes {
		t.Errorf("second run resumed %d pieces and received %d bytes; want %d pieces and %d bytes", pr2.Resumed, pf2.Received.Load(), pr1.Done, l.Bytes()-pr1.DoneBytes)
	}
	sameShard(t, out, f.path, spec)
}

// corruptingSource flips a byte in the first read that covers offset at.
type corruptingSource struct {
	inner transport.WeightSource
	at    int64
	done  atomic.Bool
}

func (c *corruptingSource) OpenWeights(sha string) (io.ReaderAt, int64, bool) {
	r, n, ok := c.inner.OpenWeights(sha)
	return corruptingReader{r, c}, n, ok
}

type corruptingReader struct {
	r io.ReaderAt
	c *corruptingSource
}

func (cr corruptingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := cr.r.ReadAt(p, off)
	if cr.c.at >= off && cr.c.at < off+int64(n) && cr.c.done.CompareAndSwap(false, true) {
		p[cr.c.at-off] ^= 0x10
	}
	return n, err
}

// A peer that serves a corrupted range (its CRC matches what it sent) is
// caught by the piece's sha256 and the piece is fetched again.
func TestFetchShardRefetchesCorruptRange(t *testing.T) {
	cs := &corruptingSource{}
	f := newWeightsFixture(t, cs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := f.tpShard()
	l, err := fetchLayout(ctx, f.client, f.relay.addr(), spec, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	victim := len(l.Pieces) / 2
	cs.at = l.Pieces[victim].Segs[0].Src + 3
	pf := &PeerFetcher{EP: f.client, Addr: f.relay.addr()}
	out := filepath.Join(t.TempDir(), "s.shard")
	pr, err := shard.Assemble(ctx, out, l, pf, shard.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !cs.done.Load() || pr.Refetched != 1 || pr.Fetched != l.Bytes()+l.Pieces[victim].Size() {
		t.Errorf("corrupted: %v, progress %+v; want one refetch of piece %d (%d bytes)", cs.done.Load(), pr, victim, l.Pieces[victim].Size())
	}
	sameShard(t, out, f.path, spec)
}
