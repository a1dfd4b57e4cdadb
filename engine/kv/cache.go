package kv

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"sync"

	"shoal/engine/quant"
)

// DefaultBlockSize is the number of token positions per block.
const DefaultBlockSize = 16

// ErrFull is returned when no free block is left.
var ErrFull = errors.New("kv cache full")

// SeqID names a sequence in the cache.
type SeqID int32

// Config sizes a cache.
type Config struct {
	FirstLayer int // global index of the first layer held
	Layers     int // number of layers held
	KVDim      int // n_head_kv * head_dim
	BlockSize  int // tokens per block (DefaultBlockSize if 0)
	NumBlocks  int // blocks in the pool
	// Type is how K and V are stored: F16 (the default, also for the zero
	// value F32), or Q8_0 or Q4_0, quantized in blocks of 32 along each
	// head (llama.cpp's --cache-type-k/-v; the head size must divide by
	// 32). A row is RowWords 16-bit words either way.
	Type quant.Type
	// VInK: the V rows are the first values of the K rows (multi-head
	// latent attention caches one latent per token, read as key and
	// value): nothing of V is stored, exported or imported.
	VInK bool
}

// Halves is the number of row kinds a position stores per layer: 1 when
// V is a view of K (VInK), else 2.
func (cfg Config) Halves() int {
	if cfg.VInK {
		return 1
	}
	return 2
}

// CheckType reports whether t can store K and V rows of heads of size
// headDim.
func CheckType(t quant.Type, headDim int) error {
	switch t {
	case quant.F16:
		return nil
	case quant.Q8_0, quant.Q4_0:
		if headDim%t.BlockLen() != 0 {
			return fmt.Errorf("kv: a %s cache needs a head size divisible by %d, this model's is %d", t, t.BlockLen(), headDim)
		}
		return nil
	}
	return fmt.Errorf("kv: cache type %s is not supported (f16, q8_0 and q4_0 are)", t)
}

// ParseType reads a KV cache type by name: "" and "f16" are F16.
func ParseType(s string) (quant.Type, error) {
	switch strings.ToLower(s) {
	case "", "f16":
		return quant.F16, nil
	case "q8_0":
		return quant.Q8_0, nil
	case "q4_0":
		return quant.Q4_0, nil
	}
	return 0, fmt.Errorf("kv: cache type %q is not supported (f16, q8_0 and q4_0 are)", s)
}

// Words is how many 16-bit words n values of cache type t take (n a
// multiple of its block length).
func Words(t quant.Type, n int) int {
	if t == quant.F32 {
		t = quant.F16
	}
	return t.RowSize(n) / 2
}

// RowWords is the words of one position's K (or V) row.
func (cfg Config) RowWords() int { return Words(cfg.Type, cfg.KVDim) }

// Cache holds K and V as F16 for Layers layers in a pool of blocks shared by
// all sequences. Block b of layer l holds positions [i*BlockSize, (i+1)*BlockSize)
// of whichever sequence has b at index i of its block table.
//
// The cache is the host side (block tables, the prefix cache, export and
// import); the rows themselves live in its Store, which the device running
// the layers owns.
// Methods are safe for concurrent use only for distinct sequences, except the
// allocation methods, which lock.
type Cache struct {
	cfg   Config
	store Store

	mu   sync.Mutex
	free []int32
	seqs map[SeqID]*seqState

	// Prefix cache: full blocks registered under the hash of the tokens up
	// to their end stay readable after their sequences end, until a
	// reservation needs the space (least recently released first).
	ref   []int32                 // per block: sequences holding it
	reg   []*prefixEntry          // per block: its entry, if registered
	index map[uint64]int32        // key -> block
	idle  *list.List              // registered blocks no sequence holds, oldest first
	elem  map[int32]*list.Element // their places in idle
}

// prefixEntry is what a registered block holds: the tokens of its positions
// and the key of the block before it, compared on every lookup so that a
// hash collision can never hand a sequence another prompt's cache.
type prefixEntry struct {
	key, parent uint64
	tokens      []int32
}

type seqState struct {
	blocks []int32
	n      int // positions filled
}

// New allocates the cache with its rows in host memory (a HostStore).
func New(cfg Config) (*Cache, error) {
	return NewWithStore(cfg, nil)
}

// NewWithStore makes the host side of a cache whose rows live in st, made
// for cfg (BlockSize filled in); nil allocates a HostStore.
func NewWithStore(cfg Config, st Store) (*Cache, error) {
	cfg = cfg.normalize()
	// KVDim 0 is a tensor-parallel member holding no heads: it tracks
	// positions and blocks but stores nothing.
	if cfg.Layers <= 0 || cfg.KVDim < 0 || cfg.NumBlocks <= 0 || cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("kv: invalid config %+v", cfg)
	}
	if err := CheckType(cfg.Type, cfg.Type.BlockLen()); err != nil {
		return nil, err
	}
	if cfg.KVDim%cfg.Type.BlockLen() != 0 {
		return nil, fmt.Errorf("kv: a %s cache cannot hold rows of %d values", cfg.Type, cfg.KVDim)
	}
	c := &Cache{cfg: cfg, seqs: map[SeqID]*seqState{}, ref: make([]int32, cfg.NumBlocks), reg: make([]*prefixEntry, cfg.NumBlocks),
		index: map[uint64]int32{}, idle: list.New(), elem: map[int32]*list.Element{}}
	if st == nil {
		st = NewHostStore(cfg)
	}
	c.store = st
	c.free = make([]int32, cfg.NumBlocks)
	for i := range c.free {
		c.free[i] = int32(cfg.NumBlocks - 1 - i)
	}
	return c, nil
}

// normalize fills in the default block size.
func (cfg Config) normalize() Config {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.Type == quant.F32 {
		cfg.Type = quant.F16
	}
	return cfg
}

// Config returns the cache's configuration.
func (c *Cache) Config() Config { return c.cfg }

// Store is where the cache's rows live.
func (c *Cache) Store() Store { return c.store }

// host is the cache's store in host memory; it panics for a device store.
func (c *Cache) host() *HostStore {
	h, ok := c.store.(*HostStore)
	if !ok {
		panic(fmt.Sprintf("kv: the cache's rows are in a %T, not in host memory", c.store))
	}
	return h
}

// FreeBlocks is the number of blocks a reservation can take: the unused
// ones and the prefix-cache blocks no sequence holds.
func (c *Cache) FreeBlocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.free) + c.idle.Len()
}

// CachedBlocks is the number of blocks registered in the prefix cache (held
// by sequences or idle).
func (c *Cache) CachedBlocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.index)
}

// Len is the number of positions filled for seq.
func (c *Cache) Len(seq SeqID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.seqs[seq]; s != nil {
		return s.n
	}
	return 0
}

// Reserve makes room for n more positions of seq (creating it if new) and
// advances its length. It returns the first new position. On ErrFull nothing
// changes.
func (c *Cache) Reserve(seq SeqID, n int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seqs[seq]
	if s == nil {
		// The table's capacity is the whole pool so that growing it never
		// allocates in the decode loop.
		s = &seqState{blocks: make([]int32, 0, c.cfg.NumBlocks)}
		c.seqs[seq] = s
	}
	bs := c.cfg.BlockSize
	need := (s.n+n+bs-1)/bs - len(s.blocks)
	if avail := len(c.free) + c.idle.Len(); need > avail {
		if s.n == 0 && len(s.blocks) == 0 {
			delete(c.seqs, seq)
		}
		return 0, fmt.Errorf("%w: sequence %d needs %d more blocks, %d free", ErrFull, seq, need, avail)
	}
	for ; need > 0; need-- {
		var b int32
		if len(c.free) > 0 {
			b = c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
		} else {
			// Evict the prefix-cache block released longest ago.
			b = c.idle.Remove(c.idle.Front()).(int32)
			delete(c.elem, b)
			c.unregister(b)
		}
		c.ref[b] = 1
		s.blocks = append(s.blocks, b)
	}
	start := s.n
	s.n += n
	return start, nil
}

// Truncate drops positions at and after n from seq, freeing whole blocks.
func (c *Cache) Truncate(seq SeqID, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seqs[seq]
	if s == nil || n >= s.n {
		return
	}
	if n < 0 {
		n = 0
	}
	keep := (n + c.cfg.BlockSize - 1) / c.cfg.BlockSize
	for _, b := range s.blocks[keep:] {
		c.release(b)
	}
	s.blocks = s.blocks[:keep]
	s.n = n
	// A block cut short will be written again: it no longer holds what it
	// was registered under.
	if n%c.cfg.BlockSize != 0 && keep > 0 {
		if b := s.blocks[keep-1]; c.reg[b] != nil && c.ref[b] == 1 {
			c.unregister(b)
		}
	}
}

// release drops one sequence's hold on b: a registered block no sequence
// holds stays in the prefix cache, any other goes back to the pool.
func (c *Cache) release(b int32) {
	c.ref[b]--
	if c.ref[b] > 0 {
		return
	}
	if c.reg[b] != nil {
		c.elem[b] = c.idle.PushBack(b)
		return
	}
	c.free = append(c.free, b)
}

func (c *Cache) unregister(b int32) {
	if e := c.reg[b]; e != nil {
		if c.index[e.key] == b {
			delete(c.index, e.key)
		}
		c.reg[b] = nil
	}
}

// PrefixKeys returns the prefix-cache key of each full block of tokens:
// block i's key hashes tokens[0:(i+1)·BlockSize] (chained block by block).
// keys may hold the keys of a prefix of tokens already (an earlier call's
// result): they are kept and only the blocks after them are hashed. Keys
// from caches with the same block size are comparable.
func (c *Cache) PrefixKeys(tokens []int32, keys []uint64) []uint64 {
	bs := c.cfg.BlockSize
	keys = keys[:min(len(keys), len(tokens)/bs)]
	var h uint64 = 0xcbf29ce484222325
	if len(keys) > 0 {
		h = keys[len(keys)-1]
	}
	for i := len(keys) * bs; i+bs <= len(tokens); i += bs {
		for _, t := range tokens[i : i+bs] {
			for k := 0; k < 4; k++ { // FNV-1a over the token's bytes
				h ^= uint64(byte(t >> (8 * k)))
				h *= 0x100000001b3
			}
		}
		keys = append(keys, h)
	}
	return keys
}

// Share starts the new sequence seq with the longest run of cached blocks
// whose keys and tokens match the first len(keys) full blocks of tokens, and
// returns the positions it now holds (a multiple of the block size; 0 when
// nothing matched or seq already has positions). The caller computes from
// there on; it must not write into the shared positions.
func (c *Cache) Share(seq SeqID, tokens []int32, keys []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.seqs[seq]; s != nil && (s.n > 0 || len(s.blocks) > 0) {
		return 0
	}
	bs := c.cfg.BlockSize
	var parent uint64
	var got []int32
	for i, k := range keys {
		b, ok := c.index[k]
		if !ok {
			break
		}
		e := c.reg[b]
		if e == nil || e.parent != parent || !slices.Equal(e.tokens, tokens[i*bs:(i+1)*bs]) {
			break
		}
		got = append(got, b)
		parent = k
	}
	if len(got) == 0 {
		return 0
	}
	s := c.seqs[seq]
	if s == nil {
		s = &seqState{blocks: make([]int32, 0, c.cfg.NumBlocks)}
		c.seqs[seq] = s
	}
	for _, b := range got {
		if c.ref[b] == 0 {
			c.idle.Remove(c.elem[b])
			delete(c.elem, b)
		}
		c.ref[b]++
		s.blocks = append(s.blocks, b)
	}
	s.n = len(got) * bs
	return s.n
}

// Publish registers seq's full blocks [0, len(keys)) under keys (see
// PrefixKeys), tokens being the sequence's tokens from position 0. Blocks
// already registered, and keys another block holds, are left as they are.
func (c *Cache) Publish(seq SeqID, tokens []int32, keys []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seqs[seq]
	if s == nil {
		return
	}
	bs := c.cfg.BlockSize
	var parent uint64
	for i, k := range keys {
		if (i+1)*bs > s.n || i >= len(s.blocks) {
			return
		}
		b := s.blocks[i]
		if c.reg[b] == nil {
			if _, taken := c.index[k]; !taken {
				c.reg[b] = &prefixEntry{key: k, parent: parent, tokens: append([]int32(nil), tokens[i*bs:(i+1)*bs]...)}
				c.index[k] = b
			}
		}
		parent = k
	}
}

// Free releases all blocks of seq.
func (c *Cache) Free(seq SeqID) {
	c.Truncate(seq, 0)
	c.mu.Lock()
	delete(c.seqs, seq)
	c.mu.Unlock()
}

// Blocks returns seq's block table (shared; do not modify). The caller must
// not run Reserve/Truncate on seq while using it.
func (c *Cache) Blocks(seq SeqID) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.seqs[seq]; s != nil {
		return s.blocks
	}
	return nil
}

// Put stores the K and V rows (KVDim each) of position pos of a sequence for
// the local layer index layer, rounding to F16 (or quantizing to the
// cache's type). The rows must be in host memory (New); a device writes its
// own store.
func (c *Cache) Put(layer int, blocks []int32, pos int, k, v []float32) {
	c.host().Put(layer, blocks, pos, k, v)
}

// K returns the key row of pos, RowWords words (a view of a cache in host
// memory).
func (c *Cache) K(layer int, blocks []int32, pos int) []uint16 { return c.host().K(layer, blocks, pos) }

// V returns the value row of pos, as K.
func (c *Cache) V(layer int, blocks []int32, pos int) []uint16 { return c.host().V(layer, blocks, pos) }

// Block wire format (little-endian):
//
//	magic "SKV1" | u32 firstLayer | u32 layers | u32 row | u32 blockSize | u32 filled
//	| layers × (K block, V block) as 16-bit words | u32 crc32 (IEEE) of everything before
//
// (a cache whose V is a view of K, Config.VInK, sends the K blocks alone)
//
// row is the words of a row (the KV dim for F16), with a quantized cache's
// ggml type number in its top 8 bits.
const blockMagic = "SKV1"

const blockHeader = 4 + 5*4

// ExportBlock serializes block index i of seq's table (all layers held), with
// filled = the number of valid positions in it.
func (c *Cache) ExportBlock(seq SeqID, i int) ([]byte, error) {
	c.mu.Lock()
	s := c.seqs[seq]
	c.mu.Unlock()
	if s == nil || i < 0 || i >= len(s.blocks) {
		return nil, fmt.Errorf("kv: sequence %d has no block %d", seq, i)
	}
	bs, d := c.cfg.BlockSize, c.cfg.RowWords()
	filled := min(bs, s.n-i*bs)
	out := make([]byte, 0, blockHeader+c.cfg.Layers*c.cfg.Halves()*bs*d*2+4)
	out = append(out, blockMagic...)
	for _, x := range []int{c.cfg.FirstLayer, c.cfg.Layers, c.rowField(), bs, filled} {
		out = binary.LittleEndian.AppendUint32(out, uint32(x))
	}
	k, v := make([]uint16, bs*d), make([]uint16, bs*d)
	for l := 0; l < c.cfg.Layers; l++ {
		c.store.ReadRows(l, s.blocks[i], 0, bs, 0, d, k, v)
		for _, src := range [][]uint16{k, v}[:c.cfg.Halves()] {
			for _, h := range src {
				out = binary.LittleEndian.AppendUint16(out, h)
			}
		}
	}
	return binary.LittleEndian.AppendUint32(out, crc32.ChecksumIEEE(out)), nil
}

// ImportBlock appends a block exported by a cache of the same shape to seq,
// which must currently end on a block boundary. It returns the positions added.
func (c *Cache) ImportBlock(seq SeqID, data []byte) (int, error) {
	bs, d := c.cfg.BlockSize, c.cfg.RowWords()
	want := blockHeader + c.cfg.Layers*c.cfg.Halves()*bs*d*2 + 4
	if len(data) != want {
		return 0, fmt.Errorf("kv: block of %d bytes, this cache's blocks take %d", len(data), want)
	}
	if string(data[:4]) != blockMagic {
		return 0, fmt.Errorf("kv: bad block magic %q", data[:4])
	}
	body := data[:len(data)-4]
	if got, sum := crc32.ChecksumIEEE(body), binary.LittleEndian.Uint32(data[len(data)-4:]); got != sum {
		return 0, fmt.Errorf("kv: block checksum %08x, want %08x", got, sum)
	}
	hdr := func(i int) int { return int(binary.LittleEndian.Uint32(data[4+4*i:])) }
	if hdr(0) != c.cfg.FirstLayer || hdr(1) != c.cfg.Layers || hdr(2) != c.rowField() || hdr(3) != bs {
		return 0, fmt.Errorf("kv: block for layers [%d,+%d) row %#x blockSize %d does not fit this cache (%d,+%d, %#x, %d)",
			hdr(0), hdr(1), hdr(2), hdr(3), c.cfg.FirstLayer, c.cfg.Layers, c.rowField(), bs)
	}
	filled := hdr(4)
	if filled <= 0 || filled > bs {
		return 0, fmt.Errorf("kv: block claims %d filled positions (block size %d)", filled, bs)
	}
	if n := c.Len(seq); n%bs != 0 {
		return 0, fmt.Errorf("kv: sequence %d has %d positions, not on a block boundary", seq, n)
	}
	start, err := c.Reserve(seq, filled)
	if err != nil {
		return 0, err
	}
	b := c.Blocks(seq)[start/bs]
	k, v := make([]uint16, bs*d), make([]uint16, bs*d)
	p := blockHeader
	for l := 0; l < c.cfg.Layers; l++ {
		for _, dst := range [][]uint16{k, v}[:c.cfg.Halves()] {
			for j := range dst {
				dst[j] = binary.LittleEndian.Uint16(data[p:])
				p += 2
			}
		}
		c.store.WriteRows(l, b, 0, bs, 0, d, k, v)
	}
	return filled, nil
}

// rowField is the block header's row field: the row's words, bit 23 set
// when V is a view of K (no V rows follow the K rows), and a quantized
// cache's type in the top 8 bits.
func (c *Cache) rowField() int {
	f := c.cfg.RowWords()
	if c.cfg.VInK {
		f |= 1 << 23
	}
	if c.cfg.Type != quant.F16 {
		f |= int(c.cfg.Type) << 24
	}
	return f
}
