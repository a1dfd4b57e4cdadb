package placement

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/quant"
)

var update = flag.Bool("update", false, "rewrite the golden outputs in testdata")

// TestGolden runs the scripts in testdata/*.txt. A script is a list of
// commands, one per line:
//
//	model name=N layers=L embd=E heads=H kv=K ff=F vocab=V type=T [out=T] [experts=X used=U] [shared=S] [tied]
//	node ID mem=16GiB gflops=G membw=B [status=failed] [draining]   (again: measured again)
//	link default|A B gbit=G ms=M
//	drain ID / fail ID / revive ID
//	plan [strategy=S] [context=C] [batch=B] [pin=a,b] [exclude=c] [margin=M] [overhead=512MiB]
//	replan [local=ID] [the options of plan]
//
// plan prints what Place decides. replan prints what Replan decides against
// the plan the script's last replan committed (none at first) and commits
// it: keep, move (the moves, then the new plan) or unservable (why, and the
// nodes released). A plan or replan command is followed by "----" and the
// expected output, which ends at a blank line. With -update the outputs
// are rewritten.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) { runScript(t, path) })
	}
}

type scenario struct {
	prof  ModelProfile
	nodes []Node
	links LinkMatrix
	// current is the plan the replan commands committed last (nil: none).
	current *Plan
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out strings.Builder
	sc := &scenario{}
	changed := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		out.WriteString(line + "\n")
		trim := strings.TrimSpace(line)
		if trim == "" || strings.HasPrefix(trim, "#") {
			continue
		}
		result, err := sc.exec(trim)
		if err != nil {
			t.Fatalf("%s:%d: %v", path, i+1, err)
		}
		if !strings.HasPrefix(trim, "plan") && !strings.HasPrefix(trim, "replan") {
			continue
		}
		var want []string
		if i+1 < len(lines) && lines[i+1] == "----" {
			i += 2
			for ; i < len(lines) && lines[i] != ""; i++ {
				want = append(want, lines[i])
			}
			if i < len(lines) {
				i-- // let the loop copy the blank line
			}
		}
		got := strings.TrimRight(result, "\n")
		if got != strings.Join(want, "\n") {
			changed = true
			if !*update {
				t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, i+1, trim, got, strings.Join(want, "\n"))
			}
		}
		out.WriteString("----\n" + got + "\n")
	}
	if *update && changed {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (sc *scenario) exec(line string) (string, error) {
	f := strings.Fields(line)
	args := map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else if a != "draining" {
			pos = append(pos, a)
		}
	}
	switch f[0] {
	case "model":
		p, err := profileFromArgs(args, pos)
		sc.prof = p
		return "", err
	case "node":
		if len(pos) != 1 {
			return "", fmt.Errorf("node wants one id")
		}
		n := Node{ID: pos[0], Status: StatusAlive}
		var err error
		if n.MemFree, err = parseBytes(args["mem"]); err != nil {
			return "", err
		}
		n.GFLOPS, _ = strconv.ParseFloat(args["gflops"], 64)
		n.MemGBps, _ = strconv.ParseFloat(args["membw"], 64)
		if s, ok := args["status"]; ok {
			n.Status = Status(s)
		}
		n.Draining = strings.Contains(line, " draining")
		for i := range sc.nodes {
			if sc.nodes[i].ID == n.ID {
				sc.nodes[i] = n // measured again
				return "", nil
			}
		}
		sc.nodes = append(sc.nodes, n)
	case "link":
		g, _ := strconv.ParseFloat(args["gbit"], 64)
		ms, _ := strconv.ParseFloat(args["ms"], 64)
		l := Link{Gbit: g, LatencyMs: ms}
		switch {
		case len(pos) == 1 && pos[0] == "default":
			sc.links.Default = l
		case len(pos) == 2:
			sc.links.Set(pos[0], pos[1], l)
		default:
			return "", fmt.Errorf("link wants default or two ids")
		}
	case "drain", "fail", "revive":
		for i := range sc.nodes {
			if len(pos) == 1 && sc.nodes[i].ID == pos[0] {
				switch f[0] {
				case "drain":
					sc.nodes[i].Draining = true
				case "fail":
					sc.nodes[i].Status = StatusFailed
				default:
					sc.nodes[i].Status, sc.nodes[i].Draining = StatusAlive, false
				}
				return "", nil
			}
		}
		return "", fmt.Errorf("no node %v", pos)
	case "plan":
		o, err := optionsFromArgs(args)
		if err != nil {
			return "", err
		}
		p, err := Place(sc.prof, sc.nodes, sc.links, o)
		if err != nil {
			return "error: " + err.Error(), nil
		}
		if err := p.Validate(sc.prof); err != nil {
			return "", fmt.Errorf("invalid plan: %v\n%s", err, p)
		}
		return p.String(), nil
	case "replan":
		o, err := optionsFromArgs(args)
		if err != nil {
			return "", err
		}
		return sc.replan(o, args["local"])
	default:
		return "", fmt.Errorf("unknown command %q", f[0])
	}
	return "", nil
}

func optionsFromArgs(args map[string]string) (Options, error) {
	var o Options
	o.Strategy = Strategy(args["strategy"])
	o.Context, _ = strconv.Atoi(args["context"])
	o.Batch, _ = strconv.Atoi(args["batch"])
	if v := args["pin"]; v != "" {
		o.Pin = strings.Split(v, ",")
	}
	if v := args["exclude"]; v != "" {
		o.Exclude = strings.Split(v, ",")
	}
	o.SafetyMargin, _ = strconv.ParseFloat(args["margin"], 64)
	if v := args["overhead"]; v != "" {
		b, err := parseBytes(v)
		if err != nil {
			return o, err
		}
		o.Overhead = b
	}
	return o, nil
}

// replan runs Replan against the current plan, commits its decision and
// prints it.
func (sc *scenario) replan(o Options, local string) (string, error) {
	d := Replan(sc.prof, sc.nodes, sc.links, o, sc.current, local)
	var b strings.Builder
	switch {
	case d.Keep && d.Unservable != "":
		fmt.Fprintf(&b, "unservable, nothing to release: %s\n", d.Unservable)
		return b.String(), nil
	case d.Keep:
		fmt.Fprintf(&b, "keep v%d\n", d.Plan.Version)
	case d.Unservable != "":
		fmt.Fprintf(&b, "unservable, release as v%d: %s\n", d.Plan.Version, d.Unservable)
	default:
		if err := d.Plan.Validate(sc.prof); err != nil {
			return "", fmt.Errorf("invalid plan: %v\n%s", err, d.Plan)
		}
		fmt.Fprintf(&b, "move to v%d, %s to fetch\n", d.Plan.Version, GiB(d.Plan.MovedBytes))
	}
	for _, w := range d.Weighed {
		fmt.Fprintf(&b, "weighed %s\n", w)
	}
	if d.Keep {
		return b.String(), nil
	}
	for _, m := range d.Plan.Moved {
		fmt.Fprintf(&b, "  %s\n", m)
	}
	if d.Unservable == "" {
		b.WriteString(d.Plan.String())
	}
	sc.current = &d.Plan
	return b.String(), nil
}

func parseBytes(s string) (uint64, error) {
	mult := 1.0
	for _, u := range []struct {
		suf string
		m   float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v, ok := strings.CutSuffix(s, u.suf); ok {
			s, mult = v, u.m
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return uint64(f * mult), nil
}

// shape is a model description for tests: the tensor table a GGUF of these
// shapes and types would have.
type shape struct {
	name                                      string
	layers, embd, heads, kv, ff, vocab, headD int
	experts, used, shared                     int
	typ, out                                  quant.Type
	tied                                      bool
}

func profileFromArgs(args map[string]string, pos []string) (ModelProfile, error) {
	s := shape{name: args["name"]}
	for k, dst := range map[string]*int{"layers": &s.layers, "embd": &s.embd, "heads": &s.heads, "kv": &s.kv, "ff": &s.ff,
		"vocab": &s.vocab, "experts": &s.experts, "used": &s.used, "shared": &s.shared, "headdim": &s.headD} {
		if v, ok := args[k]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return ModelProfile{}, fmt.Errorf("%s: %v", k, err)
			}
			*dst = n
		}
	}
	var err error
	if s.typ, err = quant.ParseType(args["type"]); err != nil {
		return ModelProfile{}, err
	}
	s.out = s.typ
	if v, ok := args["out"]; ok {
		if s.out, err = quant.ParseType(v); err != nil {
			return ModelProfile{}, err
		}
	}
	for _, p := range pos {
		if p == "tied" {
			s.tied = true
		}
	}
	return s.profile()
}

func (s shape) config() model.Config {
	if s.kv == 0 {
		s.kv = s.heads
	}
	if s.headD == 0 {
		s.headD = s.embd / s.heads
	}
	arch := "llama"
	if s.shared > 0 {
		arch = "qwen2moe"
	}
	return model.Config{Arch: model.Arch{Name: arch}, NEmbd: s.embd, NLayer: s.layers, NHead: s.heads, NHeadKV: s.kv,
		HeadDim: s.headD, NFF: s.ff, NVocab: s.vocab, NExpert: s.experts, NExpertUsed: s.used, NFFExpert: s.ff, NFFShared: s.shared}
}

func (s shape) tensors() []gguf.TensorInfo {
	c := s.config()
	E, Q, KV, F := c.NEmbd, c.QDim(), c.KVDim(), c.NFF
	var ts []gguf.TensorInfo
	off := uint64(0)
	add := func(name string, typ quant.Type, dims ...int) {
		if dims[0]%typ.BlockLen() != 0 {
			typ = quant.F16
		}
		d := make([]uint64, len(dims))
		rows := 1
		for i, x := range dims {
			d[i] = uint64(x)
			if i > 0 {
				rows *= x
			}
		}
		size := uint64(typ.RowSize(dims[0]) * rows)
		ts = append(ts, gguf.TensorInfo{Name: name, Dims: d, Type: typ, Offset: off, Size: size})
		off += (size + 31) &^ 31
	}
	emb := s.typ
	if s.tied {
		emb = s.out
	}
	add("token_embd.weight", emb, E, c.NVocab)
	for l := 0; l < c.NLayer; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", quant.F32, E)
		add(p+"attn_q.weight", s.typ, E, Q)
		add(p+"attn_k.weight", s.typ, E, KV)
		add(p+"attn_v.weight", s.typ, E, KV)
		add(p+"attn_output.weight", s.typ, Q, E)
		add(p+"ffn_norm.weight", quant.F32, E)
		if c.NExpert > 0 {
			add(p+"ffn_gate_inp.weight", quant.F32, E, c.NExpert)
			add(p+"ffn_gate_exps.weight", s.typ, E, F, c.NExpert)
			add(p+"ffn_up_exps.weight", s.typ, E, F, c.NExpert)
			add(p+"ffn_down_exps.weight", s.typ, F, E, c.NExpert)
			if S := c.NFFShared; S > 0 {
				add(p+"ffn_gate_inp_shexp.weight", quant.F32, E)
				add(p+"ffn_gate_shexp.weight", s.typ, E, S)
				add(p+"ffn_up_shexp.weight", s.typ, E, S)
				add(p+"ffn_down_shexp.weight", s.typ, S, E)
			}
		} else {
			add(p+"ffn_gate.weight", s.typ, E, F)
			add(p+"ffn_up.weight", s.typ, E, F)
			add(p+"ffn_down.weight", s.typ, F, E)
		}
	}
	add("output_norm.weight", quant.F32, E)
	if !s.tied {
		add("output.weight", s.out, E, c.NVocab)
	}
	return ts
}

func (s shape) profile() (ModelProfile, error) {
	return ProfileFromTensors(s.name, s.config(), s.tensors())
}
