// Package parallel runs one model's plan across nodes: pipeline stages hand
// hidden states to the next stage over activation streams, tensor-parallel
// groups all-reduce through transport collectives, expert-parallel members
// each run their experts; single-node is the degenerate plan.
//
// A Host sits on a node's transport endpoint (its RPC server and
// activation mailbox) and serves the Members that run there, one per shard
// (shard.SpecsFor) the node holds. A Cluster, made on any host, drives a
// plan: Open starts a Session on every member (a model.Runner of the
// member's layers and slice, and for a tensor-parallel stage two
// transport.Groups, all-reduces in the session's wire dtype and exact
// all-gathers); Step sends every member the step's number and chunks over
// RPC ("dist.step"), the tokens to the members that embed and the
// requested rows to the member that computes the logits. The first
// stage's members that hold no embedding receive it from the one that
// does; TP rank 0 of each stage sends the stage's output to every member
// of the next; the output member sends the logits (f32) to the driver.
// Hidden states travel member to member over the mailbox (f32 by default,
// f16 or q8_0 on request); the driver never relays them.
//
// Pipelined prefill: a step of many tokens through a plan of several
// stages is cut into pieces (Options.Piece; by default
// placement.PrefillPiece), whose steps go out at once. A member runs a
// session's steps in their order (a later one waits its turn), so stage 0
// computes piece k+1 while stage 1 computes piece k; the rows' logits come
// back from the pieces that hold them.
//
// Every step is bounded by the cluster's timeout, on the driver and on the
// members (which give up a little earlier so that their error, naming the
// peer they waited for, reaches the driver). A failed step makes the
// session unusable everywhere (the driver aborts it on every member); the
// hosts and their other sessions keep running.
//
// A Reconciler is a node's runtime of the committed plans, given them as a
// View (built by the node from the cluster state; parallel does not read
// Raft), the shards the node holds (a ShardSource: shard.Manager) and a
// Publisher (the node's OpenAI endpoint). It runs a Member per ready shard
// of a current plan and, where the plan's stage 0 rank 0 is this node, a
// driver: a Session in an Engine, or a local model.Runner when the plan is
// this node alone with every layer. A driver's failed step fails its
// requests and wakes the owner (Wake) to reconcile; nothing calls back up
// into the node. The driver also runs cluster logits and benchmarks on
// sessions of their own (Logits, Bench).
//
// Disaggregated prefill (handoff.go, remote.go): a plan may have a decode
// pool (first; its driver serves) and a prefill pool. Session.Handoff runs
// one prompt chunk on a session over the prefill pool while each prefill
// member sends every layer's KV, as soon as it is computed, over an
// injected KVLink (package disagg implements it on kv streams) to the
// decode members holding that layer and the overlap of their KV heads,
// which import it into positions they reserved (dist.kvopen, dist.kvwait).
// The Engine implements serve.RemotePrefiller: the prompts the plan's rule
// picks are handed off in the background while the decode steps go on;
// one whose transfer fails or stalls is prefilled by the decode pool
// instead (or fails, by policy), and no block stays held on either side.
package parallel
