package shard

import (
	"fmt"
	"slices"
	"sort"

	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/placement"
)

// ShardSpec is one node's part of a model: a layer range, a tensor-parallel
// slice of it and a subset of its experts, and whether it holds the
// embedding and the output.
type ShardSpec struct {
	Model   string `json:"model"`
	FileSHA string `json:"file_sha"` // hex sha256 of the whole GGUF file
	Lo      int    `json:"lo"`       // layers [Lo,Hi)
	Hi      int    `json:"hi"`
	TPRank  int    `json:"tp_rank"`
	TPSize  int    `json:"tp_size"`
	// HeadLo, HeadHi are query heads; FFNLo, FFNHi FFN columns (of the dense
	// FFN or the shared expert). Both are used only when TPSize > 1.
	HeadLo int `json:"head_lo"`
	HeadHi int `json:"head_hi"`
	FFNLo  int `json:"ffn_lo"`
	FFNHi  int `json:"ffn_hi"`
	// Experts are the routed experts held, ascending; nil means all, and
	// empty none (kept apart in JSON: no omitempty).
	Experts   []int `json:"experts"`
	Embedding bool  `json:"embedding"`
	Output    bool  `json:"output"`
}

// SpecsFor returns the shards node holds in plan, one per stage it is a
// member of (in pool and stage order).
func SpecsFor(plan placement.Plan, node, fileSHA string) []ShardSpec {
	var out []ShardSpec
	for _, pool := range plan.Pools {
		for _, st := range pool.Stages {
			for _, m := range st.Members {
				if m.Node != node {
					continue
				}
				out = append(out, ShardSpec{
					Model: plan.Model, FileSHA: fileSHA, Lo: st.Lo, Hi: st.Hi, TPRank: m.TPRank, TPSize: m.TPSize,
					HeadLo: m.HeadLo, HeadHi: m.HeadHi, FFNLo: m.FFNLo, FFNHi: m.FFNHi,
					Experts: slices.Clone(m.Experts), Embedding: m.Embedding, Output: m.Output,
				})
			}
		}
	}
	return out
}

// Table is what Needs reads of a model file: its shapes and tensor table.
// It is small and can be sent to a node that does not have the file.
type Table struct {
	Config     model.Config      `json:"config"`
	DataOffset uint64            `json:"data_offset"` // the GGUF header is [0,DataOffset)
	FileSize   int64             `json:"file_size"`
	Tensors    []gguf.TensorInfo `json:"tensors"`
}

// TableOf reads the table of f (no tensor data).
func TableOf(f *gguf.File) (*Table, error) {
	c, err := model.ConfigFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("shard: %w", err)
	}
	return &Table{Config: c, DataOffset: f.DataOffset, FileSize: f.Size(), Tensors: slices.Clone(f.Tensors)}, nil
}

// Range is a byte range [Off, Off+N) of the model file.
type Range struct {
	Off int64 `json:"off"`
	N   int64 `json:"n"`
}

// End is Off+N.
func (r Range) End() int64 { return r.Off + r.N }

// TensorSlice is the part of one tensor a shard holds: rows (counted over
// every dimension but the first, so experts are row runs too) and a column
// range of each. Its data is the concatenation of Segs: whole rows when the
// columns are all of them, else one segment per row, which packs into a
// matrix of Rows() x Cols().
type TensorSlice struct {
	Name    string          `json:"name"`
	Info    gguf.TensorInfo `json:"info"`
	RowRuns [][2]int        `json:"row_runs"`
	ColLo   int             `json:"col_lo"`
	ColHi   int             `json:"col_hi"`
	Segs    []Range         `json:"segs"` // absolute file ranges, in data order
}

// Rows is the number of rows held.
func (s *TensorSlice) Rows() int {
	n := 0
	for _, r := range s.RowRuns {
		n += r[1] - r[0]
	}
	return n
}

// Cols is the number of columns held per row.
func (s *TensorSlice) Cols() int { return s.ColHi - s.ColLo }

// Size is the number of bytes held.
func (s *TensorSlice) Size() int64 { return int64(s.Rows()) * int64(s.Info.Type.RowSize(s.Cols())) }

// Whole reports whether the slice is the entire tensor.
func (s *TensorSlice) Whole() bool {
	return s.ColLo == 0 && s.ColHi == s.Info.Dim(0) && len(s.RowRuns) == 1 && s.RowRuns[0] == [2]int{0, s.Info.Rows()}
}

// Slices lists the tensor slices spec needs, in file order. It checks that
// the spec is consistent with the model. A column split of attn_output or
// ffn_down that does not fall on quantization block boundaries becomes the
// member's output rows (see splitSlice).
func (s ShardSpec) Slices(t *Table) ([]TensorSlice, error) {
	c := &t.Config
	if s.Lo < 0 || s.Hi > c.NLayer || s.Lo >= s.Hi {
		return nil, fmt.Errorf("shard: layers [%d,%d) are not within [0,%d)", s.Lo, s.Hi, c.NLayer)
	}
	hd := c.HeadDim
	hLo, hHi := 0, c.NHead
	fLo, fHi := -1, -1 // -1: all columns of whatever the FFN is
	if s.TPSize > 1 {
		hLo, hHi = s.HeadLo, s.HeadHi
		if hLo < 0 || hHi > c.NHead || hLo > hHi {
			return nil, fmt.Errorf("shard: head range [%d,%d) is not within [0,%d)", hLo, hHi, c.NHead)
		}
		fLo, fHi = s.FFNLo, s.FFNHi
		if fLo < 0 || fLo > fHi {
			return nil, fmt.Errorf("shard: FFN range [%d,%d) is reversed", fLo, fHi)
		}
	}
	// The KV heads the query heads use (a range ending inside a GQA group
	// holds that group's KV head too: see model.Slice).
	kvLo, kvHi := (&model.Slice{HeadLo: hLo, HeadHi: hHi}).KVHeads(c)
	nExp := c.NExpert
	experts := s.Experts
	if experts == nil {
		for x := range nExp {
			experts = append(experts, x)
		}
	}
	for i, x := range experts {
		if x < 0 || x >= nExp || (i > 0 && x <= experts[i-1]) {
			return nil, fmt.Errorf("shard: experts %v are not ascending ids in [0,%d)", s.Experts, nExp)
		}
	}
	tensors := slices.Clone(t.Tensors)
	sort.SliceStable(tensors, func(i, j int) bool { return tensors[i].Offset < tensors[j].Offset })
	var out []TensorSlice
	for i := range tensors {
		ti := tensors[i]
		var sl *TensorSlice
		var err error
		whole := func() { sl = wholeSlice(ti) }
		layer, role, isLayer := model.LayerTensor(ti.Name)
		if !isLayer {
			switch ti.Name {
			case "token_embd.weight":
				_, hasOut := findTensor(t.Tensors, "output.weight")
				if s.Embedding || (s.Output && !hasOut) {
					whole()
				}
			case "output.weight", "output_norm.weight":
				if s.Output {
					whole()
				}
			default: // rope_freqs and the like: small, everyone
				whole()
			}
		} else if layer >= s.Lo && layer < s.Hi {
			fdim := c.FFNDim()
			lo, hi := fLo, fHi
			if lo < 0 {
				lo, hi = 0, fdim
			} else if hi > fdim {
				return nil, fmt.Errorf("shard: FFN range [%d,%d) is past the FFN size %d", lo, hi, fdim)
			}
			// the layer's own columns (a MoE model's leading dense layers are wider)
			_, lo, hi = c.LayerFFN(layer, &model.Slice{Rank: s.TPRank, Size: max(s.TPSize, 1), FFNLo: lo, FFNHi: hi})
			switch role {
			case "attn_q.weight", "attn_q_b.weight":
				qhd := c.QHeadDim()
				sl, err = rowSlice(ti, [][2]int{{hLo * qhd, hHi * qhd}})
			case "attn_k_b.weight", "attn_v_b.weight": // latent attention: rows per head
				per := c.MLA.KVLora
				if role == "attn_v_b.weight" {
					per = c.MLA.VDim
				}
				sl, err = rowSlice(ti, [][2]int{{hLo * per, hHi * per}})
			case "attn_k.weight", "attn_v.weight":
				sl, err = rowSlice(ti, [][2]int{{kvLo * hd, kvHi * hd}})
			case "attn_q.bias":
				sl, err = colSlice(ti, hLo*hd, hHi*hd)
			case "attn_k.bias", "attn_v.bias":
				sl, err = colSlice(ti, kvLo*hd, kvHi*hd)
			case "attn_output.weight":
				ohd := c.OutHeadDim()
				sl, err = s.splitSlice(ti, hLo*ohd, hHi*ohd)
			case "ffn_gate.weight", "ffn_up.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight":
				sl, err = rowSlice(ti, [][2]int{{lo, hi}})
			case "ffn_down.weight", "ffn_down_shexp.weight":
				sl, err = s.splitSlice(ti, lo, hi)
			case "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight":
				per := ti.Dim(1) // rows per expert
				sl, err = rowSlice(ti, expertRuns(experts, per))
			default: // norms, router, attn_output.bias (rank 0 adds it after the all-reduce)
				whole()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("shard: tensor %s: %w", ti.Name, err)
		}
		if sl != nil {
			for j := range sl.Segs {
				sl.Segs[j].Off += int64(t.DataOffset)
			}
			out = append(out, *sl)
		}
	}
	return out, nil
}

// Needs returns the byte ranges of the model file spec needs, the GGUF
// header included, sorted and with adjacent ranges merged.
func (s ShardSpec) Needs(t *Table) ([]Range, error) {
	sl, err := s.Slices(t)
	if err != nil {
		return nil, err
	}
	rs := []Range{{0, int64(t.DataOffset)}}
	for i := range sl {
		rs = append(rs, sl[i].Segs...)
	}
	return mergeRanges(rs), nil
}

// mergeRanges sorts rs and merges ranges that touch or overlap.
func mergeRanges(rs []Range) []Range {
	rs = slices.Clone(rs)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Off < rs[j].Off })
	var out []Range
	for _, r := range rs {
		if r.N == 0 {
			continue
		}
		if n := len(out); n > 0 && r.Off <= out[n-1].End() {
			out[n-1].N = max(out[n-1].End(), r.End()) - out[n-1].Off
			continue
		}
		out = append(out, r)
	}
	return out
}

func findTensor(ts []gguf.TensorInfo, name string) (*gguf.TensorInfo, bool) {
	for i := range ts {
		if ts[i].Name == name {
			return &ts[i], true
		}
	}
	return nil, false
}

func wholeSlice(ti gguf.TensorInfo) *TensorSlice {
	sl, _ := rowSlice(ti, [][2]int{{0, ti.Rows()}})
	return sl
}

// rowSlice keeps the rows in runs (segments relative to the data section).
func rowSlice(ti gguf.TensorInfo, runs [][2]int) (*TensorSlice, error) {
	rs := int64(ti.RowSize())
	sl := &TensorSlice{Name: ti.Name, Info: ti, ColLo: 0, ColHi: ti.Dim(0)}
	for _, r := range runs {
		if r[0] < 0 || r[1] > ti.Rows() || r[0] > r[1] {
			return nil, fmt.Errorf("rows [%d,%d) are not within [0,%d)", r[0], r[1], ti.Rows())
		}
		if r[0] == r[1] {
			continue
		}
		sl.RowRuns = append(sl.RowRuns, r)
		sl.Segs = append(sl.Segs, Range{int64(ti.Offset) + int64(r[0])*rs, int64(r[1]-r[0]) * rs})
	}
	sl.Segs = mergeRanges(sl.Segs)
	return sl, nil
}

// colSlice keeps columns [lo,hi) of every row: one segment per row (relative
// to the data section). Both
// ends must fall on the type's block boundaries.
func colSlice(ti gguf.TensorInfo, lo, hi int) (*TensorSlice, error) {
	cols := ti.Dim(0)
	if lo == 0 && hi == cols {
		return wholeSlice(ti), nil
	}
	if lo < 0 || hi > cols || lo > hi {
		return nil, fmt.Errorf("columns [%d,%d) are not within [0,%d)", lo, hi, cols)
	}
	bl := ti.Type.BlockLen()
	if lo%bl != 0 || hi%bl != 0 {
		return nil, fmt.Errorf("columns [%d,%d) are not on %s block boundaries (multiples of %d)", lo, hi, ti.Type, bl)
	}
	sl := &TensorSlice{Name: ti.Name, Info: ti, ColLo: lo, ColHi: hi}
	if lo == hi {
		return sl, nil
	}
	rows := ti.Rows()
	sl.RowRuns = [][2]int{{0, rows}}
	rs := int64(ti.RowSize())
	skip := int64(ti.Type.RowSize(lo))
	n := int64(ti.Type.RowSize(hi - lo))
	sl.Segs = make([]Range, rows)
	for r := range rows {
		sl.Segs[r] = Range{int64(ti.Offset) + int64(r)*rs + skip, n}
	}
	return sl, nil
}

// splitSlice is the part of a matrix split by input columns [lo,hi) that
// the member holds: those columns when model.ColumnSplitAligned, else
// (a column slice cannot be stored) whole rows model.OutputRows of the
// member's rank, the engine gathering the input instead. The engine loads
// exactly this (model.LoadSource).
func (s ShardSpec) splitSlice(ti gguf.TensorInfo, lo, hi int) (*TensorSlice, error) {
	if s.TPSize > 1 && !model.ColumnSplitAligned(ti.Type, lo, hi) {
		rlo, rhi := model.OutputRows(s.TPRank, s.TPSize, ti.Rows())
		return rowSlice(ti, [][2]int{{rlo, rhi}})
	}
	return colSlice(ti, lo, hi)
}

// expertRuns turns ascending expert ids into row runs of per rows each,
// merging consecutive experts.
func expertRuns(experts []int, per int) [][2]int {
	var runs [][2]int
	for _, x := range experts {
		if n := len(runs); n > 0 && runs[n-1][1] == x*per {
			runs[n-1][1] += per
			continue
		}
		runs = append(runs, [2]int{x * per, (x + 1) * per})
	}
	return runs
}
