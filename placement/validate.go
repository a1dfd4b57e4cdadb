package placement

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Validate checks that p places profile completely: in every pool the stages
// cover layers [0,n) in order without gaps or overlaps; in every stage the
// members' ranks are 0..size-1, their head ranges partition the heads on
// head-unit boundaries, their FFN ranges partition the FFN on FFN-unit
// boundaries and their experts partition the experts; exactly one member of
// the first stage holds the embedding and one of the last stage the output;
// no node appears twice in a pool.
func (p Plan) Validate(profile ModelProfile) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.Version == 0 {
		bad("plan version is 0")
	}
	if profile.Name != "" && p.Model != profile.Name {
		bad("plan is for model %q, profile is %q", p.Model, profile.Name)
	}
	if len(p.Pools) == 0 {
		bad("plan has no pools")
	}
	roles := map[string]bool{}
	for _, pool := range p.Pools {
		switch pool.Role {
		case RoleShared, RolePrefill, RoleDecode:
		default:
			bad("pool role %q is not shared, prefill or decode", pool.Role)
		}
		if roles[pool.Role] {
			bad("two %s pools", pool.Role)
		}
		roles[pool.Role] = true
		errs = append(errs, validatePool(pool, &profile)...)
	}
	if roles[RoleShared] && len(p.Pools) > 1 {
		bad("a shared pool cannot be combined with other pools")
	}
	return errors.Join(errs...)
}

func validatePool(pool Pool, prof *ModelProfile) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("pool %s: "+format, append([]any{pool.Role}, args...)...))
	}
	if len(pool.Stages) == 0 {
		bad("no stages")
		return errs
	}
	next := 0
	nodes := map[string]int{}
	embeds, outputs := 0, 0
	for k, st := range pool.Stages {
		if st.Lo != next {
			bad("stage %d starts at layer %d, want %d", k, st.Lo, next)
		}
		if st.Hi <= st.Lo || st.Hi > prof.NLayer {
			bad("stage %d has layers [%d,%d) outside [0,%d) or empty", k, st.Lo, st.Hi, prof.NLayer)
		}
		next = st.Hi
		g := len(st.Members)
		if g == 0 {
			bad("stage %d has no members", k)
			continue
		}
		ranks := make([]bool, g)
		var heads, ffn [][2]int
		experts := map[int]int{}
		for _, m := range st.Members {
			if prev, dup := nodes[m.Node]; dup {
				bad("node %s is in stages %d and %d", m.Node, prev, k)
			}
			nodes[m.Node] = k
			if m.TPSize != g {
				bad("stage %d: node %s has tp size %d, the stage has %d members", k, m.Node, m.TPSize, g)
			}
			if m.TPRank < 0 || m.TPRank >= g || ranks[m.TPRank] {
				bad("stage %d: node %s has tp rank %d (duplicate or outside 0..%d)", k, m.Node, m.TPRank, g-1)
			} else {
				ranks[m.TPRank] = true
			}
			heads = append(heads, [2]int{m.HeadLo, m.HeadHi})
			ffn = append(ffn, [2]int{m.FFNLo, m.FFNHi})
			for _, x := range m.Experts {
				experts[x]++
			}
			if m.Embedding {
				embeds++
				if k != 0 {
					bad("stage %d: node %s holds the embedding but is not in the first stage", k, m.Node)
				}
			}
			if m.Output {
				outputs++
				if k != len(pool.Stages)-1 {
					bad("stage %d: node %s holds the output but is not in the last stage", k, m.Node)
				}
			}
		}
		if err := partition(heads, prof.NHead, prof.HeadUnit); err != nil {
			bad("stage %d heads: %v", k, err)
		}
		if prof.FFNDim > 0 {
			if err := partition(ffn, prof.FFNDim, prof.FFNUnit); err != nil {
				bad("stage %d FFN: %v", k, err)
			}
		} else if slices.ContainsFunc(ffn, func(r [2]int) bool { return r != [2]int{} }) {
			bad("stage %d has FFN ranges but the model has no splittable FFN", k)
		}
		for x := range prof.NExpert {
			if experts[x] != 1 {
				bad("stage %d: expert %d is held %d times", k, x, experts[x])
			}
		}
		if len(experts) > prof.NExpert {
			bad("stage %d names experts outside 0..%d", k, prof.NExpert-1)
		}
	}
	if next != prof.NLayer {
		bad("stages end at layer %d, the model has %d", next, prof.NLayer)
	}
	if embeds != 1 {
		bad("%d members hold the embedding, want 1", embeds)
	}
	if outputs != 1 {
		bad("%d members hold the output, want 1", outputs)
	}
	return errs
}

// partition checks that ranges (empty ones allowed) tile [0,n) with
// boundaries on multiples of unit.
func partition(ranges [][2]int, n, unit int) error {
	rs := slices.Clone(ranges)
	sort.Slice(rs, func(i, j int) bool {
		if rs[i][0] != rs[j][0] {
			return rs[i][0] < rs[j][0]
		}
		return rs[i][1] < rs[j][1]
	})
	at := 0
	for _, r := range rs {
		if r[0] > r[1] {
			return fmt.Errorf("range [%d,%d) is reversed", r[0], r[1])
		}
		if r[0] == r[1] {
			continue
		}
		if r[0] != at {
			return fmt.Errorf("range [%d,%d) should start at %d", r[0], r[1], at)
		}
		if r[0]%unit != 0 || (r[1]%unit != 0 && r[1] != n) {
			return fmt.Errorf("range [%d,%d) is not on multiples of %d", r[0], r[1], unit)
		}
		at = r[1]
	}
	if at != n {
		return fmt.Errorf("ranges cover [0,%d), want [0,%d)", at, n)
	}
	return nil
}

// String prints the plan in a stable text form.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "plan v%d model=%s strategy=%s context=%d batch=%d\n", p.Version, p.Model, p.Strategy, p.Context, p.Batch)
	fmt.Fprintf(&b, "cost %s\n", p.Cost)
	for _, pool := range p.Pools {
		fmt.Fprintf(&b, "pool %s: %d stage(s)\n", pool.Role, len(pool.Stages))
		for k, st := range pool.Stages {
			fmt.Fprintf(&b, "  stage %d layers [%d,%d) %.2f ms\n", k, st.Lo, st.Hi, st.Ms)
			for _, m := range st.Members {
				fmt.Fprintf(&b, "    %s tp %d/%d heads [%d,%d)", m.Node, m.TPRank, m.TPSize, m.HeadLo, m.HeadHi)
				if m.FFNHi > m.FFNLo || m.FFNLo != 0 {
					fmt.Fprintf(&b, " ffn [%d,%d)", m.FFNLo, m.FFNHi)
				}
				if m.Experts != nil {
					fmt.Fprintf(&b, " experts %s", ExpertList(m.Experts))
				}
				if m.Embedding {
					b.WriteString(" +embd")
				}
				if m.Output {
					b.WriteString(" +output")
				}
				fmt.Fprintf(&b, " mem %s %.2f ms\n", GiB(m.MemBytes), m.Ms)
			}
		}
	}
	for _, e := range p.Explain {
		fmt.Fprintf(&b, "why: %s\n", e)
	}
	return b.String()
}

func (c Cost) String() string {
	return fmt.Sprintf("%.2f ms/token (compute %.2f, memory %.2f, network %.2f; bottleneck stage %.2f ms)",
		c.MsPerToken, c.ComputeMs, c.MemoryMs, c.NetworkMs, c.BottleneckMs)
}

// ExpertList formats sorted expert ids compactly: "0-3,6"; "-" when empty.
func ExpertList(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", xs[i], xs[j]))
		} else {
			parts = append(parts, fmt.Sprint(xs[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
