package placement

import (
	"fmt"
	"sort"
	"strings"
)

// Disaggregation modes (Options.Disagg).
const (
	DisaggAuto = "auto" // separate pools when operators pinned nodes to prefill
	DisaggOn   = "on"   // separate pools: the pinned nodes, or the most compute-rich node
	DisaggOff  = "off"  // one shared pool, whatever the pins
)

// disaggPools splits the eligible nodes into a prefill and a decode pool,
// or says why the plan keeps one shared pool (empty sets, no error), or
// that it cannot split as asked (error).
func disaggPools(nodes []Node, o Options) (prefill, decode []Node, why string, err error) {
	mode := o.Disagg
	if mode == "" {
		mode = DisaggAuto
	}
	switch mode {
	case DisaggAuto, DisaggOn, DisaggOff:
	default:
		return nil, nil, "", fmt.Errorf("placement: unknown disaggregation mode %q (want auto, on or off)", o.Disagg)
	}
	if mode == DisaggOff {
		return nil, nil, "disaggregation off: one shared pool", nil
	}
	var eligible []Node
	for _, n := range nodes {
		if n.Schedulable() && !contains(o.Exclude, n.ID) && (len(o.Pin) == 0 || contains(o.Pin, n.ID)) {
			eligible = append(eligible, n)
		}
	}
	for _, n := range eligible {
		if n.Serves == ServesPrefill {
			prefill = append(prefill, n)
		} else {
			decode = append(decode, n)
		}
	}
	switch {
	case len(prefill) > 0 && len(decode) > 0:
		return prefill, decode, fmt.Sprintf("disaggregated: %d node(s) pinned to prefill", len(prefill)), nil
	case mode == DisaggAuto:
		return nil, nil, "", nil
	case len(eligible) < 2:
		return nil, nil, "", fmt.Errorf("placement: disaggregation needs two nodes or more, %d can take the model", len(eligible))
	case len(prefill) == 0:
		// The node with the most compute per byte of memory bandwidth
		// (prefill is compute bound, decode bandwidth bound), unless the
		// operator pinned it to decode.
		cands := make([]Node, 0, len(eligible))
		for _, n := range eligible {
			if n.Serves != ServesDecode {
				cands = append(cands, n)
			}
		}
		if len(cands) == 0 {
			return nil, nil, "", fmt.Errorf("placement: every node is pinned to decode: pin one to prefill (shoal agent --role prefill)")
		}
		sort.SliceStable(cands, func(i, j int) bool {
			return ratio(cands[i]) > ratio(cands[j]) || (ratio(cands[i]) == ratio(cands[j]) && cands[i].ID < cands[j].ID)
		})
		pick := cands[0]
		decode = decode[:0]
		for _, n := range eligible {
			if n.ID != pick.ID {
				decode = append(decode, n)
			}
		}
		return []Node{pick}, decode, fmt.Sprintf("disaggregated: %s prefills (the most compute per memory bandwidth)", nodeName(pick)), nil
	default: // every eligible node is pinned to prefill
		return nil, nil, "", fmt.Errorf("placement: every node is pinned to prefill: the decode pool needs one (shoal agent --role decode or both)")
	}
}

func ratio(n Node) float64 {
	if n.MemGBps <= 0 {
		return n.GFLOPS
	}
	return n.GFLOPS / n.MemGBps
}

func nodeName(n Node) string {
	if n.Name != "" {
		return n.Name
	}
	return n.ID
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// placeDisagg plans the decode pool (first: its driver serves the model)
// over decode with the options' KV, and the prefill pool over prefill with
// KV for one prompt at a time.
func placeDisagg(profile ModelProfile, prefill, decode []Node, links LinkMatrix, o Options, why string) (Plan, error) {
	po := o
	po.Disagg, po.Pin = DisaggOff, nil
	do := po
	only := func(ns []Node) []Node {
		out := make([]Node, len(ns))
		copy(out, ns)
		return out
	}
	dec, err := placeExact(profile, only(decode), links, do)
	if err != nil {
		return Plan{}, fmt.Errorf("placement: the decode pool: %w", err)
	}
	po.Batch = 1
	pre, err := placeExact(profile, only(prefill), links, po)
	if err != nil {
		return Plan{}, fmt.Errorf("placement: the prefill pool: %w", err)
	}
	dp, pp := dec.Pools[0], pre.Pools[0]
	dp.Role, pp.Role = RoleDecode, RolePrefill
	p := dec
	p.Strategy = fmt.Sprintf("disagg (prefill %s, decode %s)", pre.Strategy, dec.Strategy)
	p.Pools = []Pool{dp, pp}
	p.Explain = []string{why}
	for _, l := range dec.Explain {
		p.Explain = append(p.Explain, "decode pool: "+l)
	}
	for _, l := range pre.Explain {
		p.Explain = append(p.Explain, "prefill pool: "+l)
	}
	return p, nil
}

// Pool returns the plan's pool of role, or nil.
func (p *Plan) Pool(role string) *Pool {
	for i := range p.Pools {
		if p.Pools[i].Role == role {
			return &p.Pools[i]
		}
	}
	return nil
}

// Disaggregated reports whether the plan has a prefill pool.
func (p *Plan) Disaggregated() bool { return p.Pool(RolePrefill) != nil }

// poolNames lists nodes by name for the explain lines.
func poolNames(ns []Node) string {
	var out []string
	for _, n := range ns {
		out = append(out, nodeName(n))
	}
	return strings.Join(out, ", ")
}
