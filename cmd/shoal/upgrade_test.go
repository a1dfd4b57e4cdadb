package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"shoal/api"
	"shoal/internal/version"
)

// TestUpgradeCheck: the cluster can take the next release when every node
// speaks a protocol of its window, a leader is known and Raft tolerates
// the server being replaced; a cluster mid-upgrade (a node of the older
// protocol left) or one without failure tolerance cannot, and says which
// nodes stand in the way. The order puts clients first and the leader last.
func TestUpgradeCheck(t *testing.T) {
	servers := []api.ServerStatus{{ID: "a", Name: "s0", Voter: true, Leader: true}, {ID: "b", Name: "s1", Voter: true}, {ID: "c", Name: "s2", Voter: true}}
	healthy := &api.Status{Leader: "a", LeaderName: "s0", FailureTolerance: 1, Servers: servers, Protocol: 2}
	nodes := func(protocols ...int) []*api.Node {
		names := []string{"s0", "s1", "s2", "c3"}
		ids := []string{"a", "b", "c", "d"}
		var out []*api.Node
		for i, p := range protocols {
			role := "server"
			if i == 3 {
				role = "client"
			}
			out = append(out, &api.Node{ID: ids[i], Name: names[i], Role: role, Status: api.StatusAlive, Version: "x", Protocol: p})
		}
		return out
	}

	r := checkUpgrade(healthy, nodes(2, 2, 2, 2), version.Window{}, "")
	if !r.Ready || r.Target != (version.Window{Min: 2, Max: 3}) || strings.Join(r.Order, ",") != "c3,s1,s2,s0" {
		t.Errorf("a healthy cluster of one protocol: %+v", r)
	}
	// Mid-upgrade: s2 still speaks protocol 1 (and reports none: 0).
	r = checkUpgrade(healthy, nodes(2, 2, 0, 2), version.Window{}, "")
	if r.Ready || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "s2 (shoal x, protocol 1)") {
		t.Errorf("a cluster mid-upgrade: %+v", r)
	}
	// The same cluster against a release that still works with protocol 1.
	if r = checkUpgrade(healthy, nodes(2, 2, 0, 2), version.Window{Min: 1, Max: 2}, "--to"); !r.Ready {
		t.Errorf("a release of protocols 1-2: %+v", r)
	}
	// Raft without tolerance: a server is down already.
	down := *healthy
	down.FailureTolerance = 0
	if r = checkUpgrade(&down, nodes(2, 2, 2, 2), version.Window{}, ""); r.Ready || !strings.Contains(strings.Join(r.Problems, ";"), "tolerates no server failure") {
		t.Errorf("no failure tolerance: %+v", r)
	}
	noLeader := *healthy
	noLeader.Leader = ""
	if r = checkUpgrade(&noLeader, nodes(2, 2, 2, 2), version.Window{}, ""); r.Ready {
		t.Errorf("no leader: %+v", r)
	}
}

// TestUpgradeCheckBinary: --to reads the next release's window from its
// binary's version -o json, and says what is wrong with a binary that
// gives none.
func TestUpgradeCheckBinary(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "shoal-next")
	if err := os.WriteFile(good, []byte("#!/bin/sh\necho '{\"version\":\"0.10.0\",\"protocol\":3,\"min_protocol\":2}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, build, err := binaryWindow(good)
	if err != nil || w != (version.Window{Min: 2, Max: 3}) || build != "0.10.0" {
		t.Errorf("binaryWindow = %v %q %v", w, build, err)
	}
	bad := filepath.Join(dir, "not-shoal")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := binaryWindow(bad); err == nil || !strings.Contains(err.Error(), "no protocol window") {
		t.Errorf("a binary without a window: %v", err)
	}
}
