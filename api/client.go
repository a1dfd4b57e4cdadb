package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultAddr is where the CLI finds the local agent (cmd/shoal uses
// https there when it is given the cluster's HTTPS CA).
const DefaultAddr = "http://127.0.0.1:7948"

// CAHint tells the operator how to make the CLI trust an agent's HTTPS
// certificate.
const CAHint = "set SHOAL_CACERT (or --cacert) to the cluster's HTTPS CA: <data-dir>/tls/https-ca.pem of any agent"

// Client calls an agent's admin API.
type Client struct {
	Addr  string // base URL; host:port is accepted
	Token string
	HTTP  *http.Client
	// LeaderWait bounds how long a request answered 503 because the
	// cluster has no leader (an election) is sent again
	// (DefaultLeaderWait if 0; < 0: never); OnLeaderWait, if set, is
	// called before each such retry (the CLI says "electing a leader,
	// retrying" once).
	LeaderWait   time.Duration
	OnLeaderWait func()
}

// DefaultLeaderWait is the default of Client.LeaderWait.
const DefaultLeaderWait = 15 * time.Second

// leaderless reports whether an error answer says the cluster has no
// leader right now.
func leaderless(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == http.StatusServiceUnavailable &&
		(strings.Contains(e.Msg, "not the leader") || strings.Contains(e.Msg, "no cluster leader"))
}

// NewClientCA is NewClient trusting the CA certificates in caPEM (PEM),
// and only them, for https addresses.
func NewClientCA(addr, token string, caPEM []byte) (*Client, error) {
	c := NewClient(addr, token)
	if len(caPEM) == 0 {
		return c, nil
	}
	hc, err := HTTPClientCA(caPEM, c.HTTP.Timeout)
	if err != nil {
		return nil, err
	}
	c.HTTP = hc
	return c, nil
}

// HTTPClientCA is an HTTP client that trusts the CA certificates in
// caPEM, and only them, for https (no CA: the system's roots).
func HTTPClientCA(caPEM []byte, timeout time.Duration) (*http.Client, error) {
	if len(caPEM) == 0 {
		return &http.Client{Timeout: timeout}, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the CA file holds no PEM certificate")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Timeout: timeout, Transport: tr}, nil
}

// NewClient builds a client from addr and token, falling back to
// SHOAL_ADDR and SHOAL_TOKEN. An address without a scheme means http.
func NewClient(addr, token string) *Client {
	if addr == "" {
		addr = os.Getenv("SHOAL_ADDR")
	}
	if addr == "" {
		addr = DefaultAddr
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	if token == "" {
		token = os.Getenv("SHOAL_TOKEN")
	}
	return &Client{Addr: strings.TrimRight(addr, "/"), Token: token, HTTP: &http.Client{Timeout: 15 * time.Second}}
}

// APIError is an error answer from the agent.
type APIError struct {
	Code int
	Msg  string
}

func (e *APIError) Error() string   { return e.Msg }
func (e *APIError) HTTPStatus() int { return e.Code }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	return c.doRaw(ctx, method, path, in, func(_ *http.Response, b []byte) error {
		if out != nil && len(b) > 0 {
			return json.Unmarshal(b, out)
		}
		return nil
	})
}

// doRaw sends in as JSON and hands a successful answer to read; an error
// answer becomes an *APIError.
// A 503 that says the cluster has no leader is retried for up to
// LeaderWait.
func (c *Client) doRaw(ctx context.Context, method, path string, in any, read func(resp *http.Response, body []byte) error) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = b
	}
	wait := c.LeaderWait
	if wait == 0 {
		wait = DefaultLeaderWait
	}
	deadline := time.Now().Add(wait)
	pause := 250 * time.Millisecond
	for {
		err := c.once(ctx, method, path, in != nil, body, read)
		if !leaderless(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		if c.OnLeaderWait != nil {
			c.OnLeaderWait()
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// once sends one request.
func (c *Client) once(ctx context.Context, method, path string, hasBody bool, reqBody []byte, read func(resp *http.Response, body []byte) error) error {
	var body io.Reader
	if hasBody {
		body = bytes.NewReader(reqBody)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Addr+path, body)
	if err != nil {
		return fmt.Errorf("agent address %q: %w", c.Addr, err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		var ue *url.Error
		if ok := asURLError(err, &ue); ok {
			err = ue.Err
		}
		var unknown x509.UnknownAuthorityError
		var hostErr x509.HostnameError
		var verr *tls.CertificateVerificationError
		switch {
		case errors.As(err, &unknown) || (errors.As(err, &verr) && !errors.As(err, &hostErr)):
			return fmt.Errorf("the agent at %s presents an HTTPS certificate this CLI does not trust (%v): %s", c.Addr, err, CAHint)
		case errors.As(err, &hostErr):
			return fmt.Errorf("the agent at %s presents an HTTPS certificate for other names (%v): use an address it names, e.g. its node name or IP", c.Addr, err)
		case strings.Contains(err.Error(), "tls: internal error"):
			return fmt.Errorf("the agent at %s has no HTTPS certificate yet: it gets one from the servers once the cluster has a leader and knows the node; retry in a few seconds (%v)", c.Addr, err)
		case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
			return fmt.Errorf("the agent at %s serves plain HTTP: use --addr http://%s", c.Addr, strings.TrimPrefix(c.Addr, "https://"))
		}
		return fmt.Errorf("cannot reach agent at %s: %v (is 'shoal agent' running? set SHOAL_ADDR)", c.Addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusBadRequest && strings.HasPrefix(c.Addr, "http://") && bytes.Contains(b, []byte("HTTP request to an HTTPS server")) {
		return fmt.Errorf("the agent at %s serves HTTPS: use --addr https://%s and %s", c.Addr, strings.TrimPrefix(c.Addr, "http://"), CAHint)
	}
	if resp.StatusCode >= 300 {
		var e Error
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return &APIError{Code: resp.StatusCode, Msg: e.Error}
		}
		return &APIError{Code: resp.StatusCode, Msg: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
	}
	return read(resp, b)
}

func asURLError(err error, target **url.Error) bool {
	ue, ok := err.(*url.Error)
	if ok {
		*target = ue
	}
	return ok
}

// Status of the cluster as the agent sees it.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.do(ctx, "GET", "/v1/status", nil, &s)
}

// Nodes in the cluster state.
func (c *Client) Nodes(ctx context.Context) ([]*Node, error) {
	var n []*Node
	return n, c.do(ctx, "GET", "/v1/nodes", nil, &n)
}

// Drain keeps new placements off a node (or lifts that with drain=false).
func (c *Client) Drain(ctx context.Context, id string, drain bool) error {
	op := "drain"
	if !drain {
		op = "undrain"
	}
	return c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(id)+"/"+op, nil, nil)
}

// RemoveNode removes a node from Raft, gossip and the state.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/nodes/"+url.PathEscape(id), nil, nil)
}

// TransferLeader makes a server node the coordinator's Raft leader.
func (c *Client) TransferLeader(ctx context.Context, id string) error {
	return c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(id)+"/lead", nil, nil)
}

// Members is the raw gossip view.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	var m []Member
	return m, c.do(ctx, "GET", "/v1/members", nil, &m)
}

// CreateToken creates a join token or admin API key.
func (c *Client) CreateToken(ctx context.Context, req TokenRequest) (*NewToken, error) {
	var t NewToken
	return &t, c.do(ctx, "POST", "/v1/tokens", req, &t)
}

// Tokens lists tokens (hashes only).
func (c *Client) Tokens(ctx context.Context) ([]*Token, error) {
	var t []*Token
	return t, c.do(ctx, "GET", "/v1/tokens", nil, &t)
}

// RevokeToken revokes a token by ID.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// RotateToken gives a token a new secret, returned once.
func (c *Client) RotateToken(ctx context.Context, id string) (*NewToken, error) {
	var t NewToken
	return &t, c.do(ctx, "POST", "/v1/tokens/"+url.PathEscape(id)+"/rotate", nil, &t)
}

// LoadModel registers a model file on a node with the cluster.
func (c *Client) LoadModel(ctx context.Context, req LoadModelRequest) (*ModelInfo, error) {
	var m ModelInfo
	return &m, c.do(ctx, "POST", "/v1/cluster/models", req, &m)
}

// Models lists the cluster's models with their shards.
func (c *Client) Models(ctx context.Context) ([]ModelInfo, error) {
	var m []ModelInfo
	return m, c.do(ctx, "GET", "/v1/cluster/models", nil, &m)
}

// UnloadModel removes a model, its plan and its shards.
func (c *Client) UnloadModel(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/cluster/models/"+url.PathEscape(name), nil, nil)
}

// PredictPrefill is the model's plan's predicted prefill of a prompt of
// tokens tokens.
func (c *Client) PredictPrefill(ctx context.Context, name string, tokens int) (*PrefillPrediction, error) {
	var p PrefillPrediction
	return &p, c.do(ctx, "GET", "/v1/cluster/models/"+url.PathEscape(name)+"/prefill?tokens="+strconv.Itoa(tokens), nil, &p)
}

// Placement is a model's committed plan.
func (c *Client) Placement(ctx context.Context, name string) (*PlacementInfo, error) {
	var p PlacementInfo
	return &p, c.do(ctx, "GET", "/v1/cluster/models/"+url.PathEscape(name)+"/placement", nil, &p)
}
