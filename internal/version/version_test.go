package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuildFromInfo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3f2a9c1e0b7d5a6c4e2f00112233445566778899"},
		{Key: "vcs.time", Value: "2026-12-06T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	b := fromInfo(bi, true)
	if b.Release != Release || b.Commit != "3f2a9c1e0b7d-dirty" || b.Date != "2026-12-06" || b.Go != "go1.26.0" {
		t.Fatalf("fromInfo = %+v", b)
	}
	if got, want := b.String(), Release+"+3f2a9c1e0b7d.dirty"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := fromInfo(nil, false); got.String() != Release || got.Commit != "" {
		t.Errorf("no build info: %+v", got)
	}
}

func TestWindow(t *testing.T) {
	if !This.Has(Protocol) || !This.Has(MinProtocol) || This.Has(Protocol+1) || This.Has(MinProtocol-1) {
		t.Fatalf("window %v", This)
	}
	if (Window{}).Or() != This || (Window{Min: 8, Max: 9}).Or() != (Window{Min: 8, Max: 9}) || BuildOr("") != String() || BuildOr("1.6.0") != "1.6.0" {
		t.Fatal("Or and BuildOr: this build's for a zero value, else the value")
	}
	if Of(0) != 1 || Of(3) != 3 {
		t.Fatal("Of: a missing protocol is 1")
	}
	m := &Mismatch{Local: Window{1, 2}, LocalBuild: "0.9.0", Remote: 9, RemoteMin: 8, RemoteBuild: "1.6.0", Peer: "n5"}
	for _, want := range []string{"0.9.0", "protocol 2", "protocols 1-2", "shoal 1.6.0", "protocol 9", "protocols 8-9", "n5", "too old for the cluster"} {
		if !strings.Contains(m.Error(), want) {
			t.Errorf("%q lacks %q", m.Error(), want)
		}
	}
	old := &Mismatch{Local: Window{3, 4}, LocalBuild: "1.0.0", Remote: 1}
	if !strings.Contains(old.Error(), "upgrade the peer to a release of protocol 3") {
		t.Errorf("older peer: %q", old.Error())
	}
}
