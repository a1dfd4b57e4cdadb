package cpu

import "shoal/engine/device"

// tpState is a range's view of its tensor-parallel group, for the halves
// whose column split is gathered.
type tpState struct {
	coll device.Collective
	device.Group
	gbuf []float32 // all-gather landing buffer
	full []float32 // gathered input, token-major
	part []float32 // this member's output rows, token-major
}

// tpCols is the per-rank input widths of attn_output (or of ffn_down) for
// gathering; nil on a single member.
func (r *Range) tpCols(ffn bool) []int {
	if r.tp == nil {
		return nil
	}
	if ffn {
		return r.tp.FFNCols
	}
	return r.tp.AttnCols
}

// allReduce sums x over the group (nothing on a single member).
func (r *Range) allReduce(x []float32) error {
	if r.tp == nil {
		return nil
	}
	return r.tp.coll.AllReduceSum(x)
}

// gatherRows all-gathers n token rows of which each member holds a column
// block (cols[p] values per token for member p, this member's in part) into
// full ([n][sum cols], the members' blocks side by side in rank order).
func (r *Range) gatherRows(part []float32, n int, cols []int, full []float32) error {
	return GatherRows(r.tp.coll, part, n, cols, full, &r.tp.gbuf)
}

// GatherRows is gatherRows for any device: buf is the all-gather's landing
// space, grown as needed.
func GatherRows(coll device.Collective, part []float32, n int, cols []int, full []float32, buf *[]float32) error {
	total := 0
	for _, c := range cols {
		total += c
	}
	me := cols[coll.Rank()]
	*buf = Grow(*buf, n*total)
	gbuf := *buf
	if err := coll.AllGather(part[:n*me], gbuf); err != nil {
		return err
	}
	at, off := 0, 0
	for _, c := range cols {
		for i := 0; i < n; i++ {
			copy(full[i*total+off:i*total+off+c], gbuf[at+i*c:at+(i+1)*c])
		}
		at += n * c
		off += c
	}
	return nil
}
