//go:build linux

package telemetry

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// attachMode chooses how classifiers are attached.
type attachMode int

const (
	modeAuto   attachMode = iota // TCX, legacy tc where the kernel has no TCX
	modeTCX                      // TCX only
	modeLegacy                   // legacy tc clsact only (tests exercise it on a TCX kernel)
)

// tcPriorityBase is the first tc filter priority tried in legacy mode; each
// probe on an interface takes the first free one from here (several agents
// on one host each attach their own filters).
const (
	tcPriorityBase  = 0xc000
	tcPriorityTries = 64
	tcFilterName    = "shoal_peers"
)

// Probe counts the agent's QUIC traffic per peer with eBPF classifiers on
// the interfaces it was attached to. Its methods are safe for concurrent use.
type Probe struct {
	mu     sync.Mutex
	port   uint16
	mode   attachMode
	objs   peersObjects
	atts   []*attachment
	legacy bool // some interface uses legacy tc
	closed bool
}

// attachment is the probe's hold on one interface.
type attachment struct {
	name    string
	ifindex int
	links   []link.Link           // TCX
	filters []*netlink.BpfFilter  // legacy tc
	qdisc   *netlink.GenericQdisc // the clsact qdisc, if this probe created it
}

// Attach loads the classifiers for UDP port port and attaches them, for
// ingress and egress, to the named interfaces of the calling thread's
// network namespace (none is fine: AddInterface adds more later). It uses
// TCX links or, when the kernel has no TCX, legacy tc filters under a
// clsact qdisc (created if absent, removed on Close only if Attach created
// it and no other filter remains under it). Errors that mean eBPF cannot be
// used here wrap ErrUnsupported.
//
// Attach only interfaces one packet crosses once: a packet that crosses two
// attached interfaces (a bridge and its port, both ends of a veth in one
// namespace) is counted twice.
func Attach(port uint16, ifaces []string) (*Probe, error) {
	return attach(port, ifaces, modeAuto)
}

func attach(port uint16, ifaces []string, mode attachMode) (*Probe, error) {
	if port == 0 {
		return nil, errors.New("telemetry: port 0")
	}
	p, err := load(port)
	if err != nil {
		return nil, err
	}
	p.mode = mode
	for _, name := range ifaces {
		if err := p.AddInterface(name); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// load loads the programs and maps for port, attached nowhere.
func load(port uint16) (*Probe, error) {
	spec, err := loadPeers()
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if err := spec.Variables[peersVarQuicPort].Set(port); err != nil {
		return nil, fmt.Errorf("telemetry: set port: %w", err)
	}
	// The sections say tcx/ingress and tcx/egress, which gives the programs
	// an expected attach type of BPF_TCX_*. The kernel does not check it for
	// tc classifiers (TCX takes the attach type when the link is created,
	// legacy tc ignores it), and kernels older than TCX (6.6) predate
	// those values, so load without one: one object serves both ways.
	for _, ps := range spec.Programs {
		ps.AttachType = ebpf.AttachNone
	}
	p := &Probe{port: port}
	err = spec.LoadAndAssign(&p.objs, nil)
	if errors.Is(err, unix.EPERM) && raiseMemlock() {
		// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK and
		// say EPERM when it is exceeded; raised, try once more.
		err = spec.LoadAndAssign(&p.objs, nil)
	}
	if err != nil {
		return nil, unsupported(fmt.Errorf("load eBPF programs: %w", err))
	}
	return p, nil
}

// raiseMemlock lifts RLIMIT_MEMLOCK if it is finite and may be lifted; it
// reports whether it changed anything.
func raiseMemlock() bool {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &cur); err != nil || cur.Cur == unix.RLIM_INFINITY {
		return false
	}
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	return unix.Setrlimit(unix.RLIMIT_MEMLOCK, &inf) == nil
}

// errnoENOTSUPP is the kernel's internal ENOTSUPP (524), which some BPF
// paths return to user space.
const errnoENOTSUPP = unix.Errno(524)

// unsupported wraps err with ErrUnsupported when it says eBPF cannot be used
// here (privileges, kernel features, the verifier); other errors pass as
// they are.
func unsupported(err error) error {
	if err == nil {
		return nil
	}
	var ve *ebpf.VerifierError
	switch {
	case errors.Is(err, ErrUnsupported):
		return err
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES),
		errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.ENOSYS),
		errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, errnoENOTSUPP),
		errors.As(err, &ve):
		return fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	return fmt.Errorf("telemetry: %w", err)
}

// AddInterface attaches the probe to one more interface (the agent calls it
// when a new peer routes through an interface not yet attached). Adding an
// interface twice does nothing.
func (p *Probe) AddInterface(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("telemetry: probe closed")
	}
	for _, a := range p.atts {
		if a.name == name {
			return nil
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("telemetry: interface %q: %w", name, err)
	}
	ingress, egress, err := p.programsFor(l)
	if err != nil {
		return err
	}
	a := &attachment{name: name, ifindex: l.Attrs().Index}
	if p.mode != modeLegacy {
		err = a.attachTCX(ingress, egress)
		if err == nil {
			p.atts = append(p.atts, a)
			return nil
		}
		if p.mode == modeTCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return unsupported(fmt.Errorf("attach tcx to %s: %w", name, err))
		}
	}
	if err := a.attachLegacy(ingress, egress); err != nil {
		return unsupported(fmt.Errorf("attach tc to %s: %w", name, err))
	}
	p.legacy = true
	p.atts = append(p.atts, a)
	return nil
}

// programsFor picks the classifiers for a link's header layout.
func (p *Probe) programsFor(l netlink.Link) (ingress, egress *ebpf.Program, err error) {
	switch t := l.Attrs().EncapType; t {
	case "ether", "loopback":
		return p.objs.CountIngress, p.objs.CountEgress, nil
	case "none", "ipip", "tunnel6", "sit", "ppp", "unknown519": // 519: ARPHRD_RAWIP
		return p.objs.CountIngressL3, p.objs.CountEgressL3, nil
	default:
		return nil, nil, fmt.Errorf("telemetry: interface %q: link type %q not supported", l.Attrs().Name, t)
	}
}

func (a *attachment) attachTCX(ingress, egress *ebpf.Program) error {
	for _, x := range []struct {
		prog *ebpf.Program
		typ  ebpf.AttachType
	}{{ingress, ebpf.AttachTCXIngress}, {egress, ebpf.AttachTCXEgress}} {
		l, err := link.AttachTCX(link.TCXOptions{Interface: a.ifindex, Program: x.prog, Attach: x.typ})
		if err != nil {
			a.detach()
			return err
		}
		a.links = append(a.links, l)
	}
	return nil
}

func (a *attachment) attachLegacy(ingress, egress *ebpf.Program) error {
	qdiscs, err := netlink.QdiscList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: a.ifindex}})
	if err != nil {
		return fmt.Errorf("list qdiscs: %w", err)
	}
	if !slices.ContainsFunc(qdiscs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" }) {
		q := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{
				LinkIndex: a.ifindex,
				Handle:    netlink.MakeHandle(0xffff, 0),
				Parent:    netlink.HANDLE_CLSACT,
			},
			QdiscType: "clsact",
		}
		switch err := netlink.QdiscAdd(q); {
		case err == nil:
			a.qdisc = q
		case errors.Is(err, os.ErrExist): // created by someone else meanwhile
		default:
			return fmt.Errorf("add clsact qdisc: %w", err)
		}
	}
	for _, x := range []struct {
		prog   *ebpf.Program
		parent uint32
	}{{ingress, netlink.HANDLE_MIN_INGRESS}, {egress, netlink.HANDLE_MIN_EGRESS}} {
		var err error
		for prio := uint16(tcPriorityBase); prio < tcPriorityBase+tcPriorityTries; prio++ {
			f := &netlink.BpfFilter{
				FilterAttrs: netlink.FilterAttrs{
					LinkIndex: a.ifindex,
					Parent:    x.parent,
					Handle:    1,
					Protocol:  unix.ETH_P_ALL,
					Priority:  prio,
				},
				Fd:           x.prog.FD(),
				Name:         tcFilterName,
				DirectAction: true,
			}
			if err = netlink.FilterAdd(f); err == nil {
				a.filters = append(a.filters, f)
				break
			}
			if !errors.Is(err, os.ErrExist) {
				break
			}
		}
		if err != nil {
			a.detach()
			return fmt.Errorf("add bpf filter: %w", err)
		}
	}
	return nil
}

// detach removes what the attachment holds; it reports the first error.
func (a *attachment) detach() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	for _, l := range a.links {
		keep(l.Close())
	}
	a.links = nil
	for _, f := range a.filters {
		// The interface may be gone, and its filters with it.
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			keep(fmt.Errorf("delete tc filter on %s: %w", a.name, err))
		}
	}
	a.filters = nil
	if a.qdisc != nil && !a.othersFilters() {
		if err := netlink.QdiscDel(a.qdisc); err != nil && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			keep(fmt.Errorf("delete clsact qdisc on %s: %w", a.name, err))
		}
		a.qdisc = nil
	}
	return first
}

// othersFilters says whether filters not the probe's own (another agent's,
// an operator's) sit under the interface's clsact qdisc: deleting the
// qdisc would delete them too, so Close leaves it then.
func (a *attachment) othersFilters() bool {
	dev := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: a.ifindex}}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(dev, parent)
		if err != nil || len(fs) > 0 {
			return err == nil
		}
	}
	return false
}

// Source returns SourceTCX, or SourceTC when any interface is attached
// with legacy tc.
func (p *Probe) Source() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.legacy {
		return SourceTC
	}
	return SourceTCX
}

// Port returns the UDP port the probe counts.
func (p *Probe) Port() uint16 { return p.port }

// Interfaces returns the names of the interfaces the probe is attached to.
func (p *Probe) Interfaces() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, len(p.atts))
	for i, a := range p.atts {
		names[i] = a.name
	}
	return names
}

// Peers returns the counters of every peer seen since Attach, sorted by
// address and port. The kernel keeps up to 4,096 (peer, port, direction)
// entries and evicts the least recently used beyond that, so a flood of
// packets from many sources to the port can push real peers out (their
// counts then restart from zero).
func (p *Probe) Peers() ([]PeerStats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("telemetry: probe closed")
	}
	by := make(map[netip.AddrPort]*PeerStats)
	var (
		key  peersPeerKey
		vals []peersPeerVal
	)
	it := p.objs.Peers.Iterate()
	for it.Next(&key, &vals) {
		ap, dir := decodeKey(key)
		var c Counters
		for _, v := range vals {
			c.Bytes += v.Bytes
			c.Packets += v.Packets
		}
		ps := by[ap]
		if ps == nil {
			ps = &PeerStats{Peer: ap}
			by[ap] = ps
		}
		switch dir {
		case Tx:
			ps.Tx.Bytes += c.Bytes
			ps.Tx.Packets += c.Packets
		case Rx:
			ps.Rx.Bytes += c.Bytes
			ps.Rx.Packets += c.Packets
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("telemetry: read counters: %w", err)
	}
	out := make([]PeerStats, 0, len(by))
	for _, ps := range by {
		out = append(out, *ps)
	}
	sortPeers(out)
	return out, nil
}

// decodeKey turns a map key into the peer and direction it counts.
func decodeKey(k peersPeerKey) (netip.AddrPort, Direction) {
	return normalize(netip.AddrPortFrom(netip.AddrFrom16(k.Addr), k.Port)), Direction(k.Dir)
}

// skbCounts returns, per direction, how many skbs were counted and how
// many of those were GSO/GRO skbs (several datagrams each).
func (p *Probe) skbCounts() (skbs, gso [2]uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range uint32(4) {
		var per []uint64
		if err := p.objs.SkbStats.Lookup(i, &per); err != nil {
			return skbs, gso, err
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		if i%2 == 0 {
			skbs[i/2] = n
		} else {
			gso[i/2] = n
		}
	}
	return skbs, gso, nil
}

// Close detaches the classifiers, removes a clsact qdisc Attach created,
// and frees the programs and maps. It reports the first error.
func (p *Probe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var first error
	for _, a := range p.atts {
		if err := a.detach(); err != nil && first == nil {
			first = err
		}
	}
	p.atts = nil
	if err := p.objs.Close(); err != nil && first == nil {
		first = err
	}
	return first
}
