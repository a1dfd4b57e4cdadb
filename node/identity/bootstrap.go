package identity

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/transport"
)

// Bootstrap without derived credentials. The cluster CA and the gossip key
// are random: a single bootstrap server makes them; servers that bootstrap
// together each make a candidate and agree on the one of the lowest node
// ID, exchanging candidates in messages sealed with a key derived from
// their shared secret (so the secret authenticates them to each other and
// nothing else does). After bootstrap, servers that know the secret answer
// the same exchange with the cluster's CA while the bootstrap token is
// valid: revoking it ends that, and nothing is derived from the secret, so
// a revoked secret yields no credential.

// candidate is one server's proposal of the cluster's CA and gossip key.
type candidate struct {
	NodeID    string `json:"node_id"`
	Name      string `json:"name"`
	CACert    []byte `json:"ca_cert"`
	CAKey     []byte `json:"ca_key"` // PKCS#8; a client started with the secret issues its own certificate, then drops it
	GossipKey []byte `json:"gossip_key"`
}

// bootstrapPoll is what a bootstrapping node sends (sealed).
type bootstrapPoll struct {
	Time       int64                 `json:"time"` // unix seconds: stale polls are refused
	From       string                `json:"from"`
	Role       string                `json:"role"`
	Candidates map[string]*candidate `json:"candidates,omitempty"`
}

// bootstrapAnswer is the reply (sealed): the candidates the answering
// server knows, or Final once it runs with the agreed CA.
type bootstrapAnswer struct {
	Time       int64                 `json:"time"`
	Candidates map[string]*candidate `json:"candidates,omitempty"`
	Final      *candidate            `json:"final,omitempty"`
}

const (
	sealPoll   = "shoal bootstrap poll"
	sealAnswer = "shoal bootstrap answer"
	// pollSkew bounds how old a sealed message may be.
	pollSkew = 5 * time.Minute
)

// sealer seals bootstrap messages with AES-256-GCM under a key derived
// from the bootstrap secret; the label (poll or answer) is the associated
// data, so an answer cannot be replayed as a poll.
type sealer struct{ aead cipher.AEAD }

func newSealer(secret string) (*sealer, error) {
	key, err := hkdf.Key(sha256.New, []byte(secret), []byte("shoal-bootstrap-v1"), "bootstrap exchange", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

func (s *sealer) seal(label string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(b)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, b, []byte(label)), nil
}

var errNotSealed = errors.New("the bootstrap message is not sealed with this cluster's bootstrap secret")

func (s *sealer) open(label string, b []byte, v any) error {
	n := s.aead.NonceSize()
	if len(b) < n {
		return errNotSealed
	}
	plain, err := s.aead.Open(nil, b[:n], b[n:], []byte(label))
	if err != nil {
		return errNotSealed
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return fmt.Errorf("bootstrap message: %w", err)
	}
	return nil
}

func fresh(unix int64, now time.Time) bool {
	d := now.Sub(time.Unix(unix, 0))
	return d < pollSkew && d > -pollSkew
}

// bootstrapSecretSum is kept in the data dir so a restart can tell a wrong
// --token from the right one without the secret deriving anything else.
func bootstrapSecretSum(secret string) string {
	k, err := hkdf.Key(sha256.New, []byte(secret), []byte("shoal-bootstrap-v1"), "secret check", 32)
	if err != nil {
		panic(err)
	}
	return hex.EncodeToString(k)
}

const bootstrapSumFile = "bootstrap.sum"

// checkBootstrapSecret tells whether secret is the one this data dir's
// cluster bootstrapped with.
func checkBootstrapSecret(tlsDir, secret string, ca *transport.CA) error {
	wrong := errors.New("--token does not match the cluster this data dir belongs to")
	if b, err := os.ReadFile(filepath.Join(tlsDir, bootstrapSumFile)); err == nil {
		if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(string(b))), []byte(bootstrapSecretSum(secret))) != 1 {
			return wrong
		}
		return nil
	}
	// A data dir from before random CAs: its CA was derived from the secret.
	old, err := transport.DeriveCA(secret)
	if err != nil {
		return err
	}
	if transport.CAHash(old.Cert) != transport.CAHash(ca.Cert) {
		return wrong
	}
	return nil
}

// newCandidate makes a fresh CA and gossip key.
func newCandidate(id, name string) (*candidate, error) {
	ca, err := transport.NewCA()
	if err != nil {
		return nil, err
	}
	key, err := marshalPKCS8(ca.Key)
	if err != nil {
		return nil, err
	}
	gk := make([]byte, 32)
	if _, err := rand.Read(gk); err != nil {
		return nil, err
	}
	return &candidate{NodeID: id, Name: name, CACert: ca.DER, CAKey: key, GossipKey: gk}, nil
}

// bootstrapSet gathers the candidates of the servers bootstrapping
// together until it holds expect of them (or learns the final one).
type bootstrapSet struct {
	mu     sync.Mutex
	expect int
	cands  map[string]*candidate
	final  *candidate
}

// merge adds the candidates another server knows. A candidate whose name
// is not a node name (coordinator.CheckNodeName) is left out: names reach
// logs and error messages. The final candidate is the running cluster's,
// taken whatever its name (which is then not shown).
func (s *bootstrapSet) merge(cs map[string]*candidate, final *candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range cs {
		if c != nil && c.NodeID == id && coordinator.CheckNodeName(c.Name) == nil && s.cands[id] == nil {
			s.cands[id] = c
		}
	}
	if final != nil && s.final == nil {
		if coordinator.CheckNodeName(final.Name) != nil {
			final.Name = ""
		}
		s.final = final
	}
}

func (s *bootstrapSet) snapshot() (map[string]*candidate, *candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]*candidate, len(s.cands))
	for id, c := range s.cands {
		out[id] = c
	}
	return out, s.final
}

// decide returns the agreed candidate, nil while waiting, or an error when
// more servers bootstrap with this secret than --bootstrap-expect says.
func (s *bootstrapSet) decide() (*candidate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final != nil {
		return s.final, nil
	}
	if s.expect < 2 || len(s.cands) < s.expect {
		return nil, nil
	}
	ids := make([]string, 0, len(s.cands))
	names := make([]string, 0, len(s.cands))
	for id, c := range s.cands {
		ids = append(ids, id)
		names = append(names, c.Name)
	}
	if len(ids) > s.expect {
		sort.Strings(names)
		return nil, fmt.Errorf("%d servers are bootstrapping with this secret (%s) but --bootstrap-expect is %d: start exactly that many, or join the others with 'shoal token create --role server'",
			len(ids), strings.Join(names, ", "), s.expect)
	}
	sort.Strings(ids)
	s.final = s.cands[ids[0]]
	return s.final, nil
}

// bootstrapIdentity gives a node started with the bootstrap secret (and no
// identity yet) the cluster's CA and gossip key.
func (a *joiner) bootstrapIdentity(ctx context.Context) error {
	if a.cfg.Server && a.cfg.BootstrapExpect == 1 {
		c, err := newCandidate(a.id, a.cfg.Name)
		if err != nil {
			return err
		}
		return a.adoptCandidate(c)
	}
	if len(a.cfg.Join) == 0 {
		return errors.New("the bootstrap secret without --bootstrap-expect 1 needs --join with the address of a server")
	}
	seal, err := newSealer(a.bootstrapSecret)
	if err != nil {
		return err
	}
	set := &bootstrapSet{expect: a.cfg.BootstrapExpect, cands: map[string]*candidate{}}
	if a.cfg.Server && a.cfg.BootstrapExpect > 1 {
		own, err := newCandidate(a.id, a.cfg.Name)
		if err != nil {
			return err
		}
		set.cands[a.id] = own
		// Answer the other servers' polls while this one gathers theirs.
		stop, err := a.answerWhileBootstrapping(seal, set)
		if err != nil {
			return err
		}
		defer stop()
	}
	deadline := time.Now().Add(a.cfg.joinTimeout())
	var last error
	for backoff := 50 * time.Millisecond; ; {
		for _, addr := range a.cfg.Join {
			cands, _ := set.snapshot()
			ans, err := a.pollBootstrap(ctx, addr, seal, cands)
			var refused *refusal
			if errors.As(err, &refused) {
				return err
			}
			if err != nil {
				last = err
				continue
			}
			set.merge(ans.Candidates, ans.Final)
		}
		c, err := set.decide()
		if err != nil {
			return err
		}
		if c != nil {
			return a.adoptCandidate(c)
		}
		if time.Now().After(deadline) {
			have, _ := set.snapshot()
			if last == nil {
				last = fmt.Errorf("heard from %d of %d servers", len(have), max(set.expect, 1))
			}
			return fmt.Errorf("could not bootstrap: %v", last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// refusal is an answer that retrying cannot change.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func (a *joiner) pollBootstrap(ctx context.Context, addr string, seal *sealer, cands map[string]*candidate) (*bootstrapAnswer, error) {
	sealed, err := seal.seal(sealPoll, bootstrapPoll{Time: time.Now().Unix(), From: a.id, Role: a.role, Candidates: cands})
	if err != nil {
		return nil, err
	}
	req, _ := json.Marshal(joinRequest{NodeID: a.id, Name: a.cfg.Name, Role: a.role, Bootstrap: sealed})
	st, done, err := transport.DialUnverified(ctx, addr, transport.KindJoin, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := exchangeJoin(st, "bootstrap", addr, req, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if resp.Err != "" {
		err := fmt.Errorf("bootstrap %s: %s", addr, resp.Err)
		if resp.Code == http.StatusForbidden {
			return nil, &refusal{err.Error()}
		}
		return nil, err
	}
	var ans bootstrapAnswer
	if err := seal.open(sealAnswer, resp.Bootstrap, &ans); err != nil {
		// Whoever answered does not know the secret: not a server of ours.
		return nil, fmt.Errorf("bootstrap %s: %w", addr, err)
	}
	if !fresh(ans.Time, time.Now()) {
		return nil, fmt.Errorf("bootstrap %s: stale answer", addr)
	}
	return &ans, nil
}

// answerBootstrap opens a poll and seals the answer; final is the cluster's
// CA once this node runs with it.
func answerBootstrap(seal *sealer, set *bootstrapSet, final *candidate, sealed []byte) *joinResponse {
	var poll bootstrapPoll
	if err := seal.open(sealPoll, sealed, &poll); err != nil {
		return &joinResponse{Err: "--token is not this cluster's bootstrap secret", Code: http.StatusForbidden}
	}
	if !fresh(poll.Time, time.Now()) {
		return &joinResponse{Err: "stale bootstrap message: check the clocks", Code: http.StatusForbidden}
	}
	ans := bootstrapAnswer{Time: time.Now().Unix(), Final: final}
	if set != nil {
		set.merge(poll.Candidates, nil)
		ans.Candidates, _ = set.snapshot()
	}
	out, err := seal.seal(sealAnswer, ans)
	if err != nil {
		return &joinResponse{Err: err.Error(), Code: http.StatusInternalServerError}
	}
	return &joinResponse{Bootstrap: out}
}

// answerWhileBootstrapping listens on the node's QUIC port with a
// throwaway certificate (the poll's seal is what authenticates) until
// the agent starts its endpoint.
func (a *joiner) answerWhileBootstrapping(seal *sealer, set *bootstrapSet) (func(), error) {
	if a.cfg.QUICPort == 0 {
		return func() {}, nil // nobody knows where to poll this node
	}
	tmp, err := transport.NewCA()
	if err != nil {
		return nil, err
	}
	ident, err := transport.SelfIssue(tmp, a.id, coordinator.RoleServer)
	if err != nil {
		return nil, err
	}
	ep, err := transport.Listen(transport.Config{
		Bind:     net.JoinHostPort(bindOr(a.cfg.Bind), strconv.Itoa(a.cfg.QUICPort)),
		Identity: ident,
	})
	if err != nil {
		return nil, err
	}
	ep.Handle(transport.KindJoin, func(st *transport.Stream) {
		defer st.Close()
		_ = st.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := transport.ReadFrame(st, maxJoinFrame)
		if err != nil {
			return
		}
		var req joinRequest
		resp := &joinResponse{Err: "this server is still bootstrapping", Code: http.StatusServiceUnavailable}
		if json.Unmarshal(b, &req) == nil && req.Bootstrap != nil {
			resp = answerBootstrap(seal, set, nil, req.Bootstrap)
		}
		out, _ := json.Marshal(resp)
		_ = transport.WriteFrame(st, out)
	})
	return func() { _ = ep.Close() }, nil
}

// adoptCandidate makes the node's identity from the agreed CA.
func (a *joiner) adoptCandidate(c *candidate) error {
	cert, err := parseCert(c.CACert)
	if err != nil {
		return fmt.Errorf("bootstrap: CA certificate: %w", err)
	}
	ca := &transport.CA{Cert: cert, DER: c.CACert}
	if len(c.CAKey) > 0 {
		if ca.Key, err = parsePKCS8(c.CAKey); err != nil {
			return fmt.Errorf("bootstrap: CA key: %w", err)
		}
	}
	if ca.Key == nil {
		return errors.New("bootstrap: the answer holds no CA key")
	}
	if len(c.GossipKey) != 32 {
		return errors.New("bootstrap: no gossip key")
	}
	if a.ident, err = transport.SelfIssueNamed(ca, a.id, a.cfg.Name, a.role); err != nil {
		return err
	}
	if a.role != coordinator.RoleServer {
		a.ident.CA = &transport.CA{Cert: ca.Cert, DER: ca.DER}
	}
	a.gossipKey = c.GossipKey
	a.log.Info("bootstrapped the cluster identity", zap.String("ca", transport.CAHash(ca.Cert)), zap.String("proposed_by", c.Name))
	return nil
}

// bindOr is the bind address, all interfaces when none is given.
func bindOr(bind string) string {
	if bind == "" {
		return "0.0.0.0"
	}
	return bind
}
