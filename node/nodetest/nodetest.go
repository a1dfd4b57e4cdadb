package nodetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/internal/logging"
	"shoal/node"
)

// Secret is the bootstrap secret every cluster here shares.
const Secret = "testcluster-bootstrap-secret"

// Logs, when a test binary sets it (with logging.SetupRing), keeps the
// agents' last log lines, which a failed test prints.
var Logs *logging.Ring

// Tuning are the short timers the harness uses.
var Tuning = node.Tuning{
	RaftTimeout:         node.Duration(200 * time.Millisecond),
	GossipProbe:         node.Duration(200 * time.Millisecond),
	ReconcileInterval:   node.Duration(200 * time.Millisecond),
	DeadServerGrace:     node.Duration(3 * time.Second),
	ServerStabilization: node.Duration(300 * time.Millisecond),
	ProbeDuration:       node.Duration(20 * time.Millisecond),
	JoinTimeout:         node.Duration(20 * time.Second),
}

// Member is one agent of the cluster; Agent is nil while stopped.
type Member struct {
	Cfg   node.Config
	Agent *node.Agent
}

// Cluster is a set of agents.
type Cluster struct {
	T       testing.TB
	base    string
	Members []*Member
}

// New starts n servers that bootstrap together.
func New(t testing.TB, n int) *Cluster { return NewWith(t, n, nil) }

// NewWith starts n servers that bootstrap together after edit changed
// member i's configuration (e.g. its memory limit).
func NewWith(t testing.TB, n int, edit func(i int, c *node.Config)) *Cluster {
	// The base dir is made before the stop cleanup is registered, so it is
	// removed only after every agent has stopped.
	c := &Cluster{T: t, base: t.TempDir()}
	t.Cleanup(c.StopAll)
	if Logs != nil {
		Logs.Lines() // what earlier tests logged
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the agents' last log lines:\n%s", strings.Join(Logs.Lines(), "\n"))
			}
		})
	}
	cfgs := make([]node.Config, n)
	var join []string
	for i := range cfgs {
		cfgs[i] = c.config(fmt.Sprintf("server-%d", i), true)
		cfgs[i].BootstrapExpect = n
		cfgs[i].Token = Secret
		join = append(join, fmt.Sprintf("127.0.0.1:%d", cfgs[i].QUICPort))
	}
	for i := range cfgs {
		for j, a := range join {
			if j != i {
				cfgs[i].Join = append(cfgs[i].Join, a)
			}
		}
		if edit != nil {
			edit(i, &cfgs[i])
		}
		m := &Member{Cfg: cfgs[i]}
		c.Members = append(c.Members, m)
	}
	// Agents start concurrently as separate machines would.
	errs := make(chan error, n)
	for _, m := range c.Members {
		go func(m *Member) {
			var err error
			m.Agent, err = c.start(m)
			errs <- err
		}(m)
	}
	for range c.Members {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *Cluster) config(name string, server bool) node.Config {
	return node.Config{
		Name: name, DataDir: filepath.Join(c.base, name), Bind: "127.0.0.1",
		GossipPort: FreeGossipPort(c.T), QUICPort: FreeUDPPort(c.T), HTTPPort: 0,
		Server: server, Version: "test", Tuning: Tuning,
	}
}

// Add starts one more agent joining through the first member's QUIC
// address with token (a join token or the bootstrap secret).
func (c *Cluster) Add(name string, server bool, token string) (*Member, error) {
	return c.AddWith(name, server, token, nil)
}

// AddWith is Add after edit changed the agent's configuration.
func (c *Cluster) AddWith(name string, server bool, token string, edit func(*node.Config)) (*Member, error) {
	cfg := c.config(name, server)
	cfg.Token = token
	for _, m := range c.Members {
		cfg.Join = append(cfg.Join, fmt.Sprintf("127.0.0.1:%d", m.Cfg.QUICPort))
		break
	}
	if edit != nil {
		edit(&cfg)
	}
	m := &Member{Cfg: cfg}
	a, err := c.start(m)
	if err != nil {
		return nil, err
	}
	m.Agent = a
	c.Members = append(c.Members, m)
	return m, nil
}

// Stop stops member i: graceful announces the leave, otherwise it is a
// crash as far as peers can tell.
func (c *Cluster) Stop(i int, graceful bool) {
	m := c.Members[i]
	if m.Agent != nil {
		_ = m.Agent.Shutdown(graceful)
		m.Agent = nil
	}
}

// Restart starts member i again from its data dir, on the same ports.
func (c *Cluster) Restart(i int) {
	c.T.Helper()
	m := c.Members[i]
	var err error
	for try := 0; try < 20; try++ {
		m.Agent, err = node.Start(context.Background(), m.Cfg)
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // a port may linger briefly
	}
	c.T.Fatalf("restart %s: %v", m.Cfg.Name, err)
}

// StopAll stops every running agent.
func (c *Cluster) StopAll() {
	for i := range c.Members {
		c.Stop(i, false)
	}
}

// Client is an admin API client of member i using key (the bootstrap
// secret when empty).
func (c *Cluster) Client(i int, key string) *api.Client {
	if key == "" {
		key = Secret
	}
	a := c.Members[i].Agent
	if !a.HTTPS() {
		return api.NewClient(a.HTTPURL(), key)
	}
	// Until the node has its certificate it has no CA file either: the
	// client then trusts nothing and its calls fail (callers poll).
	ca, _ := os.ReadFile(node.HTTPSCAPath(c.Members[i].Cfg.DataDir))
	cl, err := api.NewClientCA(a.HTTPURL(), key, ca)
	if err != nil {
		c.T.Fatal(err)
	}
	return cl
}

// Leader waits for a leader and returns its index.
func (c *Cluster) Leader(timeout time.Duration) int {
	c.T.Helper()
	i := -1
	Eventually(c.T, timeout, "a leader", func() bool {
		for j, m := range c.Members {
			if m.Agent != nil && m.Agent.Server() != nil && m.Agent.Server().IsLeader() {
				i = j
				return true
			}
		}
		return false
	})
	return i
}

// Eventually polls cond every 25ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// start starts m's agent. Ports are picked free but released before the
// agent binds them, so another test process can take one in between: on
// "address already in use" the member gets fresh ports and tries again
// (peers still find it through gossip from the addresses that work).
func (c *Cluster) start(m *Member) (*node.Agent, error) {
	for try := 0; ; try++ {
		a, err := node.Start(context.Background(), m.Cfg)
		if err == nil || try == 4 || !strings.Contains(err.Error(), "address already in use") {
			return a, err
		}
		m.Cfg.QUICPort, m.Cfg.GossipPort = FreeUDPPort(c.T), FreeGossipPort(c.T)
	}
}

// FreeUDPPort returns a UDP port that was free a moment ago.
func FreeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// FreeGossipPort returns a port free for both TCP and UDP.
func FreeGossipPort(t testing.TB) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free gossip port")
	return 0
}
