package node_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/internal/version"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestJoinAcrossVersions: a node of the previous protocol (a build from
// before protocols were named speaks only protocol 1) joins a cluster of
// this build and is listed with its version and protocol; a node whose
// protocols and the cluster's do not meet is refused at once, not after
// the join timeout, with both versions and both windows in its error.
func TestJoinAcrossVersions(t *testing.T) {
	c := tc.New(t, 1)
	c.Leader(20 * time.Second)
	tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{Description: "versions"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := c.AddWith("old", false, tok.Secret, func(cfg *node.Config) {
		cfg.Protocols, cfg.Version = version.Window{Min: 1, Max: 1}, "0.8.0"
	})
	if err != nil {
		t.Fatalf("a node of protocol 1 joining a cluster of protocols %v: %v", version.This, err)
	}
	tc.Eventually(t, 20*time.Second, "both nodes listed with their versions", func() bool {
		ns, err := c.Client(0, "").Nodes(ctx(t))
		if err != nil || len(ns) != 2 {
			return false
		}
		for _, n := range ns {
			switch n.Name {
			case "old":
				if n.Version != "0.8.0" || n.Protocol != 1 || n.Status != api.StatusAlive {
					return false
				}
			default:
				if n.Version != "test" || n.Protocol != version.Protocol {
					return false
				}
			}
		}
		return true
	})
	_ = old

	tok2, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{Description: "too new"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err = c.AddWith("future", false, tok2.Secret, func(cfg *node.Config) {
		cfg.Protocols, cfg.Version = version.Window{Min: version.Protocol + 6, Max: version.Protocol + 7}, "1.6.0"
		cfg.Tuning.JoinTimeout = node.Duration(time.Minute)
	})
	if err == nil {
		t.Fatal("a node of protocols outside the cluster's window joined")
	}
	for _, want := range []string{"version mismatch", "shoal 1.6.0", "shoal test", version.This.String(),
		"protocols " + strconv.Itoa(version.Protocol+6) + "-" + strconv.Itoa(version.Protocol+7)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
	t.Logf("refused: %v", err)
	if d := time.Since(t0); d > 20*time.Second {
		t.Errorf("the refusal took %v: a version mismatch is not retried", d)
	}
}
