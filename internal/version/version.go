package version

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Release is the semantic version of this source tree. A release build
// may set another with -ldflags "-X shoal/internal/version.release=...".
const Release = "0.9.0"

// Protocol is the protocol this build speaks; MinProtocol the oldest it
// works with. Raise Protocol with every change to what another node reads
// (and keep reading what MinProtocol writes); raise MinProtocol when the
// code for the oldest protocol goes.
//
// The protocols: 1, every build before versions were negotiated; 2, the
// protocol in ALPN, join, gossip, Raft log entries and snapshots (and the
// protocol-set command); 3, tensor-parallel members cut a step of many
// tokens into parts whose all-reduces overlap compute (OverlapProtocol),
// a different sequence of collectives, made only when every member of
// the group speaks 3; 4, a tensor-parallel group's collectives travel over
// TCP between members that both speak 4 (DirectProtocol), QUIC otherwise;
// 5, a model may have a draft model, which the state records and whose
// shard its driver reports (DraftProtocol).
const (
	Protocol    = 5
	MinProtocol = 1
)

// OverlapProtocol is the first protocol whose tensor-parallel members run
// overlapped steps.
const OverlapProtocol = 3

// DirectProtocol is the first protocol whose endpoints accept a tensor-
// parallel group's collectives over TCP, on their QUIC port's number.
const DirectProtocol = 4

// DraftProtocol is the first protocol whose servers keep a model's draft
// model (model load --draft) and its shard's reports: a cluster loads
// one only once every node speaks it.
const DraftProtocol = 5

// release overrides Release when set at link time.
var release string

// Build is what the binary knows of itself.
type Build struct {
	Release string `json:"release"`          // semantic version, e.g. 0.9.0
	Commit  string `json:"commit,omitempty"` // 12 hex digits, "-dirty" when the tree had changes
	Date    string `json:"date,omitempty"`   // the commit's date, YYYY-MM-DD
	Go      string `json:"go"`
}

// Current is this binary's build.
func Current() Build { return fromInfo(debug.ReadBuildInfo()) }

func fromInfo(bi *debug.BuildInfo, ok bool) Build {
	b := Build{Release: Release}
	if release != "" {
		b.Release = release
	}
	if !ok || bi == nil {
		return b
	}
	b.Go = bi.GoVersion
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value[:min(12, len(s.Value))]
		case "vcs.time":
			if len(s.Value) >= 10 {
				b.Date = s.Value[:10]
			}
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Commit != "" {
		b.Commit += "-dirty"
	}
	return b
}

// String is the version as nodes gossip and report it: the release, with
// the commit as semver build metadata when it is known
// ("0.9.0+3f2a9c1e0b7d").
func (b Build) String() string {
	if b.Commit == "" {
		return b.Release
	}
	return b.Release + "+" + strings.ReplaceAll(b.Commit, "-dirty", ".dirty")
}

// String is the current build's version (Build.String).
func String() string { return Current().String() }

// Window is a range of protocols a build works with.
type Window struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// This is the window of this build.
var This = Window{MinProtocol, Protocol}

// Has reports whether the window includes protocol p.
func (w Window) Has(p int) bool { return p >= w.Min && p <= w.Max }

func (w Window) String() string {
	if w.Min == w.Max {
		return fmt.Sprintf("protocol %d", w.Max)
	}
	return fmt.Sprintf("protocols %d-%d", w.Min, w.Max)
}

// Of is the protocol a peer reported, where a missing one (0: a build
// from before versions) is protocol 1.
func Of(p int) int {
	if p <= 0 {
		return 1
	}
	return p
}

// Mismatch is the error of a peer whose protocols and this build's do not
// meet: the connection is refused before anything else is said.
type Mismatch struct {
	Local      Window
	LocalBuild string // this side's version
	// Remote and RemoteMin are the peer's protocol and the oldest it works
	// with, RemoteBuild its version: zero when the peer did not say (a
	// build from before protocol 2 answers no version query).
	Remote, RemoteMin int
	RemoteBuild       string
	Peer              string // who the peer is, for the message (an address, a node name)
}

func (m *Mismatch) Error() string {
	remote := "a build that speaks none of them (one from before protocol 2 speaks only protocol 1)"
	if m.Remote > 0 {
		remote = fmt.Sprintf("protocol %d (works with %s)", m.Remote, Window{max(m.RemoteMin, 1), m.Remote})
		if m.RemoteBuild != "" {
			remote = "shoal " + m.RemoteBuild + ", " + remote
		}
	}
	peer := ""
	if m.Peer != "" {
		peer = " at " + m.Peer
	}
	hint := "two adjacent releases work together: upgrade one step at a time"
	switch {
	case m.Remote > 0 && m.Remote < m.Local.Min:
		hint = fmt.Sprintf("upgrade the peer to a release of protocol %d or later first", m.Local.Min)
	case m.Remote > 0 && max(m.RemoteMin, 1) > m.Local.Max:
		hint = "this node's release is too old for the cluster: upgrade it"
	}
	return fmt.Sprintf("version mismatch: this node runs shoal %s (protocol %d, works with %s); the peer%s runs %s: %s",
		m.LocalBuild, m.Local.Max, m.Local, peer, remote, hint)
}

// Or is w, or this build's window when w is zero: what a component takes
// when its caller names no window (only tests run one as another build).
func (w Window) Or() Window {
	if w == (Window{}) {
		return This
	}
	return w
}

// BuildOr is b, or this build's version when b is empty.
func BuildOr(b string) string {
	if b == "" {
		return String()
	}
	return b
}
