package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"shoal/coordinator"
	"shoal/transport"
)

// meta is what an agent gossips about itself (node's meta: the same JSON
// keys).
type meta struct {
	Name    string  `json:"n"`
	Role    string  `json:"r"`
	Version string  `json:"v"`
	QUIC    int     `json:"q"`
	HTTP    int     `json:"h"`
	Expect  int     `json:"e,omitempty"`
	Mem     uint64  `json:"mt"`
	Free    uint64  `json:"mf"`
	Cores   int     `json:"c"`
	GFLOPS  float64 `json:"g"`
	GBps    float64 `json:"b"`
	Accel   string  `json:"a,omitempty"`
	Serves  string  `json:"sv,omitempty"`
}

// delegate gives memberlist the fake member's meta.
type delegate struct{ meta []byte }

func (d delegate) NodeMeta(limit int) []byte                  { return d.meta }
func (d delegate) NotifyMsg([]byte)                           {}
func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d delegate) LocalState(join bool) []byte                { return nil }
func (d delegate) MergeRemoteState(buf []byte, join bool)     {}

// counter counts what reaches the attacker's endpoint.
type counter struct {
	mu      sync.Mutex
	streams map[string]int
	methods []string
}

func (c *counter) add(k transport.Kind, method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.streams[k.String()]++
	if method != "" && len(c.methods) < 100 {
		c.methods = append(c.methods, method)
	}
}

// gossipAttack joins the cluster's gossip with its key as the member
// o.fakeID (a node ID) whose meta says name o.name, role o.role, the
// QUIC port o.quicPort and o.memGiB of memory. With --listen, an endpoint
// with the certificate in --tls listens on that port and counts every
// stream any node opens to it (a Raft stream above all). With
// --cert-servers, it asks those servers for an HTTPS certificate from
// that endpoint, o.certAfter after joining and at the end, and reports
// the names they signed. The member stays o.duration (or until SIGTERM)
// and then leaves (or, with --no-leave, just stops).
func gossipAttack(ctx context.Context, o opts, res *result) {
	keyFile := o.gossipKey
	if keyFile == "" {
		keyFile = filepath.Join(o.tlsDir, "gossip.key")
	}
	gk, err := os.ReadFile(keyFile)
	if err != nil {
		fail(fmt.Sprintf("gossip key: %v", err))
	}
	if o.fakeID == "" {
		o.fakeID = newID()
	}
	res.Member = o.fakeID
	c := &counter{streams: map[string]int{}}
	var ep *transport.Endpoint
	if o.listen {
		ep, _ = endpoint(o.tlsDir, o.bind, o.quicPort)
		defer ep.Close()
		o.quicPort = ep.Addr().Port
		for k := transport.Kind(1); k < 32; k++ {
			k := k
			ep.Handle(k, func(s *transport.Stream) {
				defer s.Close()
				method := ""
				if k == transport.KindRPC {
					_ = s.SetReadDeadline(time.Now().Add(2 * time.Second))
					if b, err := transport.ReadFrame(s, transport.DefaultMaxFrame); err == nil {
						var req struct {
							Method string `json:"method"`
						}
						_ = json.Unmarshal(b, &req)
						method = req.Method
					}
				}
				c.add(k, method)
			})
		}
	}
	const gib = 1 << 30
	m := meta{Name: o.name, Role: o.role, Version: "dev", QUIC: o.quicPort, HTTP: 7948,
		Mem: o.memGiB * gib, Free: o.memGiB * gib, Cores: o.cores, GFLOPS: 50 * float64(o.cores), GBps: 100}
	mb, _ := json.Marshal(m)
	if len(mb) > memberlist.MetaMaxSize {
		fail("meta too long")
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = o.fakeID
	mc.BindAddr, mc.BindPort = o.bind, o.gossipPort
	mc.AdvertiseAddr, mc.AdvertisePort = o.bind, o.gossipPort
	mc.SecretKey = gk
	mc.Delegate = delegate{meta: mb}
	mc.LogOutput = io.Discard
	if os.Getenv("ATTACKER_DEBUG") != "" {
		mc.LogOutput = os.Stderr
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		fail(fmt.Sprintf("memberlist: %v", err))
	}
	defer func() { _ = ml.Shutdown() }()
	deadline := time.Now().Add(o.duration)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		n, err := ml.Join([]string{o.join})
		if n > 0 {
			res.Joined = n
			break
		}
		res.Attempts = append(res.Attempts, outcome("gossip join", err))
		sleep(ctx, 500*time.Millisecond)
	}

	names := map[string]bool{}
	askCert := func() {
		if o.certServers == "" || ep == nil {
			return
		}
		for _, srv := range strings.Split(o.certServers, ",") {
			dns, err := httpsCert(ctx, ep, srv)
			res.Attempts = append(res.Attempts, outcome("HTTPS certificate from "+srv, err))
			for _, d := range dns {
				names[d] = true
			}
		}
	}
	if o.certServers != "" {
		sleep(ctx, min(o.certAfter, time.Until(deadline)))
		askCert()
	}
	sleep(ctx, time.Until(deadline))
	askCert()
	if !o.noLeave {
		_ = ml.Leave(2 * time.Second)
	}

	for d := range names {
		res.DNSNames = append(res.DNSNames, d)
	}
	sort.Strings(res.DNSNames)
	c.mu.Lock()
	res.Streams, res.Methods = c.streams, c.methods
	c.mu.Unlock()
}

// httpsCert asks the server at addr for an HTTPS certificate as the node
// ep's certificate names, and returns the DNS names it carries.
func httpsCert(ctx context.Context, ep *transport.Endpoint, addr string) ([]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(key.Public())
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var resp coordinator.HTTPSCertResponse
	if err := transport.Call(cctx, ep, addr, transport.KindRPC, coordinator.MethodHTTPSCert, coordinator.HTTPSCertRequest{PublicKey: pub}, &resp); err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(resp.Cert)
	if err != nil {
		return nil, err
	}
	out := append([]string{}, cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		out = append(out, ip.String())
	}
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
