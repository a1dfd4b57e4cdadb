// Package shard turns a node's part of a plan into bytes: which tensors and
// byte ranges of the model file a ShardSpec needs, loading them from a local
// copy, and assembling them from ranges fetched elsewhere into a verified,
// resumable shard file. It knows nothing of Raft or HTTP: the transport
// plugs in as a RangeFetcher.
//
// # Slicing
//
// GGUF stores a matrix as rows of its first dimension (ggml order): a
// [cols x rows] weight is rows × RowSize(cols) bytes, each row a run of
// quantization blocks. A tensor-parallel member holds:
//
//   - matrices split by output rows (attn_q, attn_k, attn_v, ffn_gate,
//     ffn_up and the shared expert's): a contiguous row range, one byte range;
//   - matrices split by input columns (attn_output, ffn_down): the same
//     column range of every row, one short range per row. A column range
//     must start and end on block boundaries (256 elements for K-quants, 32
//     for the legacy formats) to be stored; when it does not (a 2-way head
//     split of a 256-column Q4_K attn_output), the member holds whole rows
//     model.OutputRows(rank, size, rows) instead and the engine gathers the
//     input (see model.Slice);
//   - routed experts (ffn_{gate,up,down}_exps, stacked along the last
//     dimension): whole experts, a contiguous run of rows per run of
//     consecutive experts;
//   - norms, the router, attn_output.bias: whole (small, replicated).
//
// Head ranges follow GQA: query heads [lo,hi) use KV heads
// [lo/g, ceil(hi/g)) for g query heads per KV head; a range that splits a
// group holds that group's KV head too (model.Slice.KVHeads). Needs merges touching ranges and always includes the GGUF header.
//
// The column-split matrices cost many small ranges (one per row). The
// alternatives are a re-laid-out file where each TP slice is contiguous
// (fast to fetch, but the file no longer matches the model's sha256 and
// every TP size needs its own layout), or fetching whole rows and dropping
// the rest (simple, but a 2-way split then moves the full matrix). shard
// keeps the original file as the single source of truth and packs the row
// segments: in a shard file, and in Open, a column slice becomes a dense
// rows × (hi−lo) matrix the engine can use directly. Pieces group those
// segments so one checksum and (with a BatchFetcher) one request cover many
// rows.
//
// # Shard files
//
// Layout is a pure function of the tensor table, the spec and the piece
// size: the GGUF header then each tensor slice (32-byte aligned) in the
// data region, and the list of pieces, each a run of (source offset,
// destination offset, length) segments of at most 1 MiB. Its ID, a sha256
// of the file's sha256 and every segment, is the shard's content address.
// Sign fills each piece's sha256 from a trusted copy of the file (one whose
// whole-file sha256 was verified); the fetch loop trusts nothing else.
//
// The file format is described in file.go: a header, the layout as a
// checksummed JSON index, one state byte per piece and the data region.
// Assemble fetches missing pieces in parallel, verifies each against its
// sha256 and fetches it again on a mismatch or a failed read, writes it,
// and marks it present only after a sync. Restarted on a partial file, it
// re-hashes the present pieces and fetches only the rest. Progress is
// reported through a callback after every piece.
//
// Open maps a local GGUF and builds the shard from views of only the needed
// ranges; OpenFile maps a complete shard file. Both give the same Shard:
// the spec, the model configuration and the tensor slices with their data.
//
// # No single holder
//
// A signed layout needs the node with the whole file. So that a re-plan
// does not, the source also builds a Manifest while hashing the file: the
// tensor table and the sha256 of every unit (the GGUF header, or a run of
// whole rows of one tensor, at most 1 MiB). Its ID goes into the cluster
// state with the model. A node that assembled a shard keeps the manifest
// and serves the ranges of its complete shard files (HeldReader), also for
// a while after a re-plan released them. When the source is down or fails,
// a HolderFetcher asks the live holders for their ranges and the manifest
// (checked against the recorded ID), builds the layout from its table,
// fetches every unit a piece touches (its parts from several holders when
// no one holds it whole: each half of a tensor-parallel row), checks it
// against the unit's sum and, on a mismatch, fetches it again with the
// holders of the failed try ranked last. Assemble signs the layout from
// these verified bytes. Verification stays end to end: every byte is
// checked against sums that trace back to the source's read of the file.
//
// Whole copies of the file (the node package's --replicas) are checked
// the same way as they arrive: a FileVerifier checks every unit against
// the manifest and the whole file against its sha256.
//
// # The manager
//
// A Manager holds a node's shards: given the shards the node should hold
// (Want, from the plans), it opens each from the node's own copy of the
// file (LocalFiles) or fetches its signed layout and assembles it from the
// ranges of the node that has the file (Peers: the transport plugs in),
// or, for a model no node has the file of (one read in place from a hub),
// from the holders and the Want's Origin (a RangeFetcher of the whole file,
// ranked last, every unit checked against the manifest like a holder's),
// retries failures with a back-off, reports a per-model Status through a
// callback (the node records it in the cluster state), and releases the
// shards no longer wanted after a hook has stopped what runs on them.
package shard
