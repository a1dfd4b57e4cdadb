package shard

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"
	"sort"

	"shoal/engine/gguf"
)

// DefaultUnitSize bounds the bytes of one manifest unit.
const DefaultUnitSize = 1 << 20

// Manifest makes any byte a shard needs verifiable without the node the
// model was loaded from: the model file's table and the sha256 of every
// unit, where a unit is the GGUF header or a run of whole rows of one
// tensor (at most UnitSize bytes, at least one row). Units never cover the
// padding between tensors, so the nodes holding shards hold whole units
// between them: a tensor-parallel pair holds each row's two halves.
//
// The source node builds it while hashing the file; its ID (the sha256 of
// its JSON) is recorded with the model in the cluster state, the trust
// anchor: a manifest from any peer is checked against it, and the layout
// of a new shard is built from its table.
type Manifest struct {
	FileSHA  string   `json:"file_sha"`
	Table    *Table   `json:"table"`
	UnitSize int64    `json:"unit_size"`
	Sums     []string `json:"sums"`
	// Unverified marks a manifest without Sums: the table of a file whose
	// bytes no node has checked yet (a hub file read in place, whose
	// sha256 is checked once the nodes hold their ranges). Shards
	// assembled under it are held and served to peers, never run.
	Unverified bool `json:"unverified,omitempty"`
}

// UnverifiedManifest is the manifest, as JSON, of the file with sha256
// fileSHA (not checked yet) and table t: its units without sums.
func UnverifiedManifest(fileSHA string, t *Table, unitSize int64) ([]byte, error) {
	if unitSize <= 0 {
		unitSize = DefaultUnitSize
	}
	return json.Marshal(&Manifest{FileSHA: fileSHA, Table: t, UnitSize: unitSize, Unverified: true})
}

// ManifestID is the content address of a manifest's JSON.
func ManifestID(raw []byte) string {
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])
}

// Units lists the units of t (the header, then each tensor's row runs),
// in file order.
func Units(t *Table, unitSize int64) []Range {
	if unitSize <= 0 {
		unitSize = DefaultUnitSize
	}
	out := []Range{{0, int64(t.DataOffset)}}
	ts := slices.Clone(t.Tensors)
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].Offset < ts[j].Offset })
	for i := range ts {
		ti := &ts[i]
		rs := int64(ti.RowSize())
		rows := int64(ti.Rows())
		if rs <= 0 || rows <= 0 {
			continue
		}
		per := max(1, unitSize/rs)
		base := int64(t.DataOffset) + int64(ti.Offset)
		for r := int64(0); r < rows; r += per {
			k := min(per, rows-r)
			out = append(out, Range{base + r*rs, k * rs})
		}
	}
	return out
}

// BuildManifest reads the model file at path once and returns its sha256
// and its manifest (as JSON, the form whose ID is recorded).
func BuildManifest(path string, unitSize int64) (sha string, raw []byte, err error) {
	if unitSize <= 0 {
		unitSize = DefaultUnitSize
	}
	gf, err := gguf.Open(path)
	if err != nil {
		return "", nil, err
	}
	t, err := TableOf(gf)
	gf.Close()
	if err != nil {
		return "", nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	sha, raw, err = BuildManifestFrom(t, bufio.NewReaderSize(f, 1<<20), unitSize)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	return sha, raw, nil
}

// BuildManifestFrom reads a model file whose table is t from r, once and
// in order, and returns its sha256 and its manifest (as JSON). Nothing is
// kept but the sums: r may be a stream of the file from anywhere (the hub).
func BuildManifestFrom(t *Table, r io.Reader, unitSize int64) (sha string, raw []byte, err error) {
	if unitSize <= 0 {
		unitSize = DefaultUnitSize
	}
	units := Units(t, unitSize)
	uw := &unitHasher{units: units, whole: sha256.New(), sums: make([]string, len(units))}
	n, err := io.Copy(uw, r)
	if err != nil {
		return "", nil, err
	}
	if uw.next < len(units) {
		return "", nil, fmt.Errorf("shard: the file is shorter than its tensor table")
	}
	if t.FileSize > 0 && n != t.FileSize {
		return "", nil, fmt.Errorf("shard: read %d bytes of a %d-byte file", n, t.FileSize)
	}
	sha = hex.EncodeToString(uw.whole.Sum(nil))
	raw, err = json.Marshal(&Manifest{FileSHA: sha, Table: t, UnitSize: unitSize, Sums: uw.sums})
	return sha, raw, err
}

// unitHasher hashes the whole stream and every unit of it; with want, it
// fails at the first unit whose sum differs.
type unitHasher struct {
	units []Range
	whole hash.Hash
	pos   int64
	next  int // the unit being hashed or the next one
	cur   hash.Hash
	sums  []string
	want  []string
}

func (u *unitHasher) Write(p []byte) (int, error) {
	u.whole.Write(p)
	n := len(p)
	for len(p) > 0 && u.next < len(u.units) {
		r := u.units[u.next]
		if u.pos < r.Off { // padding before the unit
			skip := min(int64(len(p)), r.Off-u.pos)
			p, u.pos = p[skip:], u.pos+skip
			continue
		}
		if u.cur == nil {
			u.cur = sha256.New()
		}
		k := min(int64(len(p)), r.End()-u.pos)
		u.cur.Write(p[:k])
		p, u.pos = p[k:], u.pos+k
		if u.pos == r.End() {
			u.sums[u.next] = hex.EncodeToString(u.cur.Sum(nil))
			u.cur = nil
			if u.want != nil && u.sums[u.next] != u.want[u.next] {
				return n - len(p), fmt.Errorf("shard: bytes [%d,+%d) of the file fail their manifest checksum", r.Off, r.N)
			}
			u.next++
		}
	}
	u.pos += int64(len(p))
	return n, nil
}

// ParseManifest checks raw against the recorded id and the file's sha256
// and decodes it.
func ParseManifest(raw []byte, id, fileSHA string) (*Manifest, error) {
	if got := ManifestID(raw); got != id {
		return nil, fmt.Errorf("shard: manifest %.12s is not the recorded %.12s", got, id)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("shard: manifest: %w", err)
	}
	if m.FileSHA != fileSHA || m.Table == nil || m.UnitSize <= 0 {
		return nil, fmt.Errorf("shard: manifest is for file %.12s, not %.12s", m.FileSHA, fileSHA)
	}
	if m.Unverified {
		if len(m.Sums) != 0 {
			return nil, fmt.Errorf("shard: an unverified manifest with %d unit checksums", len(m.Sums))
		}
		return &m, nil
	}
	if n := len(Units(m.Table, m.UnitSize)); n != len(m.Sums) {
		return nil, fmt.Errorf("shard: manifest has %d unit checksums for %d units", len(m.Sums), n)
	}
	return &m, nil
}

// FileVerifier checks a whole model file written through it against its
// manifest: every unit's sha256 as its bytes pass (a write fails at the
// first unit that differs) and, in Check, the whole file's sha256.
type FileVerifier struct {
	m *Manifest
	u *unitHasher
	n int64
}

// NewFileVerifier checks a file against m.
func NewFileVerifier(m *Manifest) *FileVerifier {
	units := Units(m.Table, m.UnitSize)
	return &FileVerifier{m: m, u: &unitHasher{units: units, whole: sha256.New(), sums: make([]string, len(units)), want: m.Sums}}
}

// Write implements io.Writer.
func (v *FileVerifier) Write(p []byte) (int, error) {
	n, err := v.u.Write(p)
	v.n += int64(n)
	return n, err
}

// Check reports whether the bytes written are the file: every unit seen
// and matching, and the whole file's sha256 the manifest's.
func (v *FileVerifier) Check() error {
	if v.u.next < len(v.u.units) {
		return fmt.Errorf("shard: %d bytes end before unit %d of %d of the manifest", v.n, v.u.next, len(v.u.units))
	}
	if got := hex.EncodeToString(v.u.whole.Sum(nil)); got != v.m.FileSHA {
		return fmt.Errorf("shard: the %d bytes have sha256 %.12s, not the file's %.12s", v.n, got, v.m.FileSHA)
	}
	return nil
}
