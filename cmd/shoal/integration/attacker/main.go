package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"shoal/cmd/shoal/integration/attacker/report"
	"shoal/coordinator"
	"shoal/transport"
)

// What the attacker prints (report.Result), by the names this program
// uses.
type (
	attempt    = report.Attempt
	result     = report.Result
	stateToken = report.StateToken
)

// opts are the attacker's flags; each subcommand reads those it needs.
type opts struct {
	tlsDir, server, bind, key, id, secret, revoke string
	method, url, body, cacert                     string

	// model-bomb, unknown-type, layout, dist-open
	name, model string
	pieces      string // layout: the piece sizes asked, comma-separated
	count       int
	closeEach   bool
	timeoutMs   int64

	// gossip
	join, gossipKey, role, fakeID, certServers string
	gossipPort, quicPort                       int
	listen, noLeave                            bool
	memGiB                                     uint64
	cores                                      int
	duration, certAfter                        time.Duration

	// streams
	conns, per int
	window     time.Duration

	// trickle, join
	limit    time.Duration
	interval time.Duration
	token    string
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: attacker apply|remove|lead|state|http|model-bomb|unknown-type|gossip|layout|dist-open|streams|trickle|join [flags]")
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var o opts
	fs.StringVar(&o.tlsDir, "tls", "", "the tls folder of a node's data dir (its certificate, key, CA and gossip.key)")
	fs.StringVar(&o.server, "server", "", "QUIC address of a server (or, for layout and dist-open, of the agent that serves the model)")
	fs.StringVar(&o.bind, "bind", "0.0.0.0", "IP to open the QUIC endpoint (and the gossip member) on")
	fs.StringVar(&o.key, "key", "", "apply/remove/model-bomb/unknown-type: a key to relay as the operator's; http/trickle: the Bearer key")
	fs.StringVar(&o.id, "id", "", "apply: ID of the admin token to write; remove: the node to remove")
	fs.StringVar(&o.secret, "secret", "", "apply: the 16-character secret of the admin token to write")
	fs.StringVar(&o.revoke, "revoke", "", "apply: also try to revoke this token")
	fs.StringVar(&o.method, "method", "GET", "http: method")
	fs.StringVar(&o.url, "url", "", "http/trickle: URL")
	fs.StringVar(&o.body, "body", "", "http: request body")
	fs.StringVar(&o.cacert, "cacert", "", "http/trickle: the PEM file of the CA to trust for https URLs")
	fs.StringVar(&o.name, "name", "", "model-bomb: the model's name; gossip: the name in the member's meta; join: the name asked for")
	fs.StringVar(&o.model, "model", "tiny", "layout/dist-open/model-bomb: the model attacked (model-bomb copies its record)")
	fs.StringVar(&o.pieces, "pieces", "1", "layout: piece sizes to ask for, comma-separated")
	fs.IntVar(&o.count, "count", 1, "dist-open: sessions to open")
	fs.BoolVar(&o.closeEach, "close", false, "dist-open: close each session after opening it")
	fs.Int64Var(&o.timeoutMs, "timeout-ms", 600000, "dist-open: the sessions' step timeout")
	fs.StringVar(&o.join, "join", "", "gossip: a server's gossip address (host:7946)")
	fs.StringVar(&o.gossipKey, "gossip-key", "", "gossip: the gossip key file (default: gossip.key in --tls)")
	fs.StringVar(&o.role, "role", "server", "gossip: the role in the member's meta")
	fs.StringVar(&o.fakeID, "fake-id", "", "gossip: the member's memberlist name (a node ID)")
	fs.StringVar(&o.certServers, "cert-servers", "", "gossip: servers (QUIC) to ask for an HTTPS certificate, comma-separated")
	fs.IntVar(&o.gossipPort, "gossip-port", 7956, "gossip: the member's gossip port")
	fs.IntVar(&o.quicPort, "quic-port", 0, "gossip: the QUIC port gossiped (with --listen, where the endpoint listens; 0 picks one)")
	fs.BoolVar(&o.noLeave, "no-leave", false, "gossip: stop without leaving (a member that took a live node's ID would announce that node's leave)")
	fs.BoolVar(&o.listen, "listen", false, "gossip: listen on the gossiped QUIC port with --tls's certificate and count what arrives")
	fs.Uint64Var(&o.memGiB, "mem-gib", 16, "gossip: memory claimed in the meta, GiB")
	fs.IntVar(&o.cores, "cores", 4, "gossip: cores claimed in the meta")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "gossip: how long the member stays (SIGTERM ends it sooner)")
	fs.DurationVar(&o.certAfter, "cert-after", 8*time.Second, "gossip: when to ask --cert-servers for an HTTPS certificate (again at the end)")
	fs.IntVar(&o.conns, "conns", 4, "streams: QUIC connections")
	fs.IntVar(&o.per, "per", 4000, "streams: RPC streams opened on each connection")
	fs.DurationVar(&o.window, "window", 15*time.Second, "streams: how long to watch the streams after opening them")
	fs.DurationVar(&o.limit, "limit", 150*time.Second, "trickle: give up after this long")
	fs.DurationVar(&o.interval, "interval", time.Second, "trickle: one body byte per interval")
	fs.StringVar(&o.token, "token", "", "join: the join token (ID.secret.CA-hash)")
	_ = fs.Parse(os.Args[2:])

	var res result
	timeout := 20 * time.Second
	switch os.Args[1] {
	case "gossip":
		timeout = o.duration + 30*time.Second
	case "streams":
		timeout = 2*time.Minute + o.window
	case "trickle":
		timeout = o.limit + 30*time.Second
	case "dist-open", "layout":
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// SIGTERM ends a long attack early; it still prints what it saw.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	switch os.Args[1] {
	case "http":
		res.Status, res.Body = request(ctx, httpClient(o.cacert), o.method, o.url, o.key, o.body)
	case "apply", "remove", "lead", "state":
		call := dial(o.tlsDir, o.bind, o.server)
		switch os.Args[1] {
		case "apply":
			res.Attempts = apply(ctx, call, o.id, o.secret, o.key, o.revoke)
		case "remove":
			for _, a := range variants(o.key) {
				err := call(ctx, coordinator.MethodRemoveNode, coordinator.NodeRequest{ID: o.id, Key: a.key, Forwarded: a.forwarded}, nil)
				res.Attempts = append(res.Attempts, outcome("remove "+a.name, err))
			}
		case "lead":
			for _, a := range variants(o.key) {
				err := call(ctx, coordinator.MethodTransferLeader, coordinator.NodeRequest{ID: o.id, Key: a.key, Forwarded: a.forwarded}, nil)
				res.Attempts = append(res.Attempts, outcome("lead "+a.name, err))
			}
		case "state":
			var st coordinator.State
			if err := call(ctx, coordinator.MethodState, nil, &st); err != nil {
				res.Attempts = append(res.Attempts, outcome("state", err))
				break
			}
			res.Nodes = len(st.Nodes)
			for _, t := range st.SortedTokens() {
				res.Tokens = append(res.Tokens, stateToken{ID: t.ID, Kind: t.Kind, HasHash: t.SecretHash != ""})
			}
		}
	case "model-bomb":
		res.Attempts = modelBomb(ctx, o)
	case "unknown-type":
		res.Attempts = unknownType(ctx, o)
	case "gossip":
		gossipAttack(ctx, o, &res)
	case "layout":
		layoutAttack(ctx, o, &res)
	case "dist-open":
		distOpen(ctx, o, &res)
	case "streams":
		streamFlood(ctx, o, &res)
	case "trickle":
		trickle(ctx, o, &res)
	case "join":
		res.Attempts = joinAs(ctx, o)
	default:
		fail("unknown command " + os.Args[1])
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "attacker: "+msg)
	os.Exit(2)
}

type caller func(ctx context.Context, method string, in, out any) error

// dial opens a QUIC endpoint with the node's certificate in tlsDir and
// returns a caller of server's RPCs.
func dial(tlsDir, bind, server string) caller {
	ep, _ := endpoint(tlsDir, bind, 0)
	return func(ctx context.Context, method string, in, out any) error {
		return transport.Call(ctx, ep, server, transport.KindRPC, method, in, out)
	}
}

// endpoint opens a QUIC endpoint on bind:port with the certificate of the
// node whose tls folder is tlsDir.
func endpoint(tlsDir, bind string, port int) (*transport.Endpoint, *transport.Identity) {
	ident, err := transport.LoadIdentity(tlsDir)
	if err != nil {
		fail(fmt.Sprintf("identity: %v", err))
	}
	ep, err := transport.Listen(transport.Config{Bind: net.JoinHostPort(bind, strconv.Itoa(port)), Identity: ident})
	if err != nil {
		fail(fmt.Sprintf("endpoint: %v", err))
	}
	return ep, ident
}

type variant struct {
	name      string
	key       string
	forwarded bool
}

// variants are the ways a client node might dress a write: bare, marked
// as forwarded by a server, and relaying a key that is not an admin key.
func variants(key string) []variant {
	v := []variant{{name: "bare"}, {name: "forwarded", forwarded: true}}
	if key != "" {
		v = append(v, variant{name: "with a non-admin key", key: key})
	}
	return v
}

// apply tries to write an admin token whose secret the attacker knows,
// and to revoke an existing token.
func apply(ctx context.Context, call caller, id, secret, key, revoke string) []attempt {
	sum := sha256.Sum256([]byte(secret))
	tok := coordinator.Token{ID: id, Kind: coordinator.TokenAdmin, SecretHash: hex.EncodeToString(sum[:]),
		Description: "written by a client node", CreatedAt: time.Now()}
	create, _ := json.Marshal(coordinator.TokenCreateRequest{Token: tok})
	var out []attempt
	for _, v := range variants(key) {
		err := call(ctx, coordinator.MethodApply, coordinator.ApplyRequest{Type: coordinator.TokenCreateType, Body: create, Key: v.key, Forwarded: v.forwarded}, nil)
		out = append(out, outcome("token create "+v.name, err))
		if revoke != "" {
			body, _ := json.Marshal(coordinator.TokenRevokeRequest{ID: revoke, Now: time.Now()})
			err = call(ctx, coordinator.MethodApply, coordinator.ApplyRequest{Type: coordinator.TokenRevokeType, Body: body, Key: v.key, Forwarded: v.forwarded}, nil)
			out = append(out, outcome("token revoke "+v.name, err))
		}
	}
	return out
}

func outcome(name string, err error) attempt {
	if err == nil {
		return attempt{Name: name}
	}
	return attempt{Name: name, Code: transport.StatusOf(err), Err: err.Error()}
}

// httpClient trusts only the CA in cacert (the system roots when empty).
func httpClient(cacert string) *http.Client {
	if cacert == "" {
		return http.DefaultClient
	}
	pem, err := os.ReadFile(cacert)
	if err != nil {
		fail(err.Error())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		fail("no certificate in " + cacert)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func request(ctx context.Context, hc *http.Client, method, url, key, body string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader([]byte(body)))
	if err != nil {
		fail(err.Error())
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}
