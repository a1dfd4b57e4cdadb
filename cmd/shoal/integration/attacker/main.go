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
	"time"

	"shoal/coordinator"
	"shoal/transport"
)

// attempt is one call and how the server answered it.
type attempt struct {
	Name string `json:"name"`
	Code int    `json:"code"` // 0: accepted
	Err  string `json:"err,omitempty"`
}

// result is what the attacker prints.
type result struct {
	Attempts []attempt `json:"attempts,omitempty"`
	// Cluster.State as a client node saw it.
	Tokens []stateToken `json:"tokens,omitempty"`
	Nodes  int          `json:"nodes,omitempty"`
	// An HTTP request's answer.
	Status int    `json:"status,omitempty"`
	Body   string `json:"body,omitempty"`
}

type stateToken struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	HasHash bool   `json:"has_hash"`
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: attacker apply|remove|state|http [flags]")
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	tlsDir := fs.String("tls", "", "the tls folder of a client node's data dir")
	server := fs.String("server", "", "QUIC address of a server")
	bind := fs.String("bind", "0.0.0.0", "IP to open the QUIC endpoint on")
	key := fs.String("key", "", "apply/remove: a key to relay as the operator's; http: the Bearer key")
	id := fs.String("id", "", "apply: ID of the admin token to write; remove: the node to remove")
	secret := fs.String("secret", "", "apply: the 16-character secret of the admin token to write")
	revoke := fs.String("revoke", "", "apply: also try to revoke this token")
	method := fs.String("method", "GET", "http: method")
	url := fs.String("url", "", "http: URL")
	body := fs.String("body", "", "http: request body")
	cacert := fs.String("cacert", "", "http: the PEM file of the CA to trust for https URLs")
	_ = fs.Parse(os.Args[2:])

	var res result
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch os.Args[1] {
	case "http":
		res.Status, res.Body = request(ctx, httpClient(*cacert), *method, *url, *key, *body)
	case "apply", "remove", "state":
		call := dial(*tlsDir, *bind, *server)
		switch os.Args[1] {
		case "apply":
			res.Attempts = apply(ctx, call, *id, *secret, *key, *revoke)
		case "remove":
			for _, a := range variants(*key) {
				err := call(ctx, coordinator.MethodRemoveNode, coordinator.RemoveRequest{ID: *id, Key: a.key, Forwarded: a.forwarded}, nil)
				res.Attempts = append(res.Attempts, outcome("remove "+a.name, err))
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

// dial opens a QUIC endpoint with the client node's certificate.
func dial(tlsDir, bind, server string) caller {
	ident, err := transport.LoadIdentity(tlsDir)
	if err != nil {
		fail(fmt.Sprintf("identity: %v", err))
	}
	ep, err := transport.Listen(transport.Config{Bind: net.JoinHostPort(bind, "0"), Identity: ident})
	if err != nil {
		fail(fmt.Sprintf("endpoint: %v", err))
	}
	return func(ctx context.Context, method string, in, out any) error {
		return transport.Call(ctx, ep, server, transport.KindRPC, method, in, out)
	}
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
