package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"shoal/disagg"
	"shoal/parallel"
	"shoal/serve"
)

var (
	descQueue     = prometheus.NewDesc("shoal_queue_depth", "Requests waiting for a place in the running batch.", []string{"model"}, nil)
	descRunning   = prometheus.NewDesc("shoal_running_sequences", "Sequences in the running batch.", []string{"model"}, nil)
	descKVUsed    = prometheus.NewDesc("shoal_kv_blocks_used", "KV cache blocks in use.", []string{"model"}, nil)
	descKVFree    = prometheus.NewDesc("shoal_kv_blocks_free", "KV cache blocks free.", []string{"model"}, nil)
	descBatch     = prometheus.NewDesc("shoal_batch_tokens", "Tokens in the last batch step.", []string{"model"}, nil)
	descSteps     = prometheus.NewDesc("shoal_batch_steps_total", "Batch steps run.", []string{"model"}, nil)
	descPreempt   = prometheus.NewDesc("shoal_preemptions_total", "Sequences preempted for lack of KV blocks.", []string{"model"}, nil)
	descKVCached  = prometheus.NewDesc("shoal_kv_blocks_cached", "KV cache blocks registered in the prefix cache (held by sequences or idle and reusable).", []string{"model"}, nil)
	descPrefixHit = prometheus.NewDesc("shoal_prompt_tokens_cached_total", "Prompt tokens read from the prefix cache instead of computed.", []string{"model"}, nil)
	descDrafted   = prometheus.NewDesc("shoal_draft_tokens_total", "Tokens drafted for verification, by prompt lookup (--lookup) or a draft model (--draft).", []string{"model"}, nil)
	descAccepted  = prometheus.NewDesc("shoal_draft_tokens_accepted_total", "Drafted tokens the model agreed with: generated without a step of their own.", []string{"model"}, nil)
	descReplays   = prometheus.NewDesc("shoal_replays_total", "Times the driver moved a model's running sequences to a new session (a failed step or a new plan) and replayed them.", []string{"model"}, nil)
	descReplayLag = prometheus.NewDesc("shoal_replay_last_pause_seconds", "How long the last replay paused the model's steps.", []string{"model"}, nil)
	descMemberMs  = prometheus.NewDesc("shoal_member_step_seconds", "Time a member node of a model run across nodes took to answer a step of the driver (a later stage's includes waiting for the earlier).", []string{"model", "node"}, nil)
	descLeader    = prometheus.NewDesc("shoal_raft_leader", "1 if this agent is the Raft leader.", nil, nil)
	descMembers   = prometheus.NewDesc("shoal_gossip_members", "Gossip members by state as this agent sees them.", []string{"state"}, nil)
	descRaftKnown = prometheus.NewDesc("shoal_raft_leader_known", "1 if this agent knows a Raft leader.", nil, nil)
	descRemote    = prometheus.NewDesc("shoal_remote_prefills_total", "Prompts of a disaggregated plan by where they were prefilled: ok (on the prefill pool), failed (tried there, then prefilled by the decode pool), local (the routing rule kept them on the decode pool, or the prefill pool was unreachable).", []string{"model", "outcome"}, nil)
	descRemoteTok = prometheus.NewDesc("shoal_remote_prefill_tokens_total", "Prompt tokens prefilled on the prefill pool.", []string{"model"}, nil)
	descRemoteSec = prometheus.NewDesc("shoal_remote_prefill_seconds_total", "Time the remote prefills that ended well took, KV transfer included.", []string{"model"}, nil)
	descRemoteRun = prometheus.NewDesc("shoal_remote_prefills_running", "Remote prefills under way.", []string{"model"}, nil)
	descRemotePh  = prometheus.NewDesc("shoal_remote_prefill_phase_seconds_total", "Where remote prefills' time went: queue (waiting for the prefill pool), open (reserving the positions on the decode pool), step (the prefill pool's steps, KV sent as they go), wait (the decode pool finishing its imports after a step).", []string{"model", "phase"}, nil)
	descBuild     = prometheus.NewDesc("shoal_build_info", "1, labelled with the agent's version, the protocol it speaks, the oldest protocol it works with and its Go version.", []string{"version", "protocol", "min_protocol", "go"}, nil)
	descClusterP  = prometheus.NewDesc("shoal_cluster_protocol", "The cluster's protocol as this server's state records it: the newest every alive node speaks.", nil, nil)
	descKVLink    = prometheus.NewDesc("shoal_kv_link_bytes_total", "KV cache bytes this node's kv streams carried, by direction and kind (payload, framing).", []string{"direction", "kind"}, nil)
)

// Source is what the agent's collector reads at each scrape.
type Source struct {
	// Models calls fn with each model this agent drives: its scheduler
	// and, for a model run across nodes, its engine (nil: a local runner).
	Models func(fn func(name string, sc *serve.Scheduler, eng *parallel.Engine))
	// KVLink is the disaggregated KV link's counts (ok false: no link).
	KVLink func() (disagg.LinkStats, bool)
	// Raft tells whether this agent leads and whether it knows a leader
	// (both false on a client agent).
	Raft func() (leader, known bool)
	// Gossip counts the members memberlist lists alive and otherwise (ok
	// false: gossip is not running).
	Gossip func() (alive, other int, ok bool)
	// Build is the agent's version and protocols (shoal_build_info).
	Build Build
	// ClusterProtocol is the cluster's protocol in this server's state (ok
	// false on a client agent; nil: not reported).
	ClusterProtocol func() (int, bool)
}

// Build names the agent's build for shoal_build_info.
type Build struct {
	Version               string
	Protocol, MinProtocol int
	Go                    string
}

// Agent is the collector of the agent's live state.
func Agent(src Source) prometheus.Collector { return &agentCollector{src} }

// agentCollector reads live state at scrape time.
type agentCollector struct{ src Source }

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descRunning, descKVUsed, descKVFree, descBatch, descSteps, descPreempt, descKVCached, descPrefixHit,
		descDrafted, descAccepted, descReplays, descReplayLag, descMemberMs, descLeader, descMembers, descRaftKnown, descRemote, descRemoteTok, descRemoteSec, descRemoteRun, descRemotePh, descKVLink, descBuild, descClusterP} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	c.src.Models(func(name string, sc *serve.Scheduler, eng *parallel.Engine) {
		collectScheduler(ch, name, sc)
		collectEngine(ch, name, eng)
	})
	if ls, ok := c.src.KVLink(); ok {
		ch <- prometheus.MustNewConstMetric(descKVLink, prometheus.CounterValue, float64(ls.SentPayload), "sent", "payload")
		ch <- prometheus.MustNewConstMetric(descKVLink, prometheus.CounterValue, float64(ls.SentFraming), "sent", "framing")
		ch <- prometheus.MustNewConstMetric(descKVLink, prometheus.CounterValue, float64(ls.RecvPayload), "received", "payload")
		ch <- prometheus.MustNewConstMetric(descKVLink, prometheus.CounterValue, float64(ls.RecvFraming), "received", "framing")
	}
	leader, known := c.src.Raft()
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, one(leader))
	ch <- prometheus.MustNewConstMetric(descRaftKnown, prometheus.GaugeValue, one(known))
	if alive, other, ok := c.src.Gossip(); ok {
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(alive), "alive")
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(other), "other")
	}
	if b := c.src.Build; b.Protocol > 0 {
		ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, b.Version, strconv.Itoa(b.Protocol), strconv.Itoa(b.MinProtocol), b.Go)
	}
	if c.src.ClusterProtocol != nil {
		if p, ok := c.src.ClusterProtocol(); ok {
			ch <- prometheus.MustNewConstMetric(descClusterP, prometheus.GaugeValue, float64(p))
		}
	}
}

func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collectScheduler sends the state of the scheduler serving model n.
func collectScheduler(ch chan<- prometheus.Metric, n string, sc *serve.Scheduler) {
	st := sc.Stats()
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(st.Waiting), n)
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(st.Running), n)
	ch <- prometheus.MustNewConstMetric(descKVUsed, prometheus.GaugeValue, float64(st.KVBlocksUsed), n)
	ch <- prometheus.MustNewConstMetric(descKVFree, prometheus.GaugeValue, float64(st.KVBlocksTotal-st.KVBlocksUsed), n)
	ch <- prometheus.MustNewConstMetric(descBatch, prometheus.GaugeValue, float64(st.LastBatchTokens), n)
	ch <- prometheus.MustNewConstMetric(descSteps, prometheus.CounterValue, float64(st.Steps), n)
	ch <- prometheus.MustNewConstMetric(descPreempt, prometheus.CounterValue, float64(st.Preemptions), n)
	ch <- prometheus.MustNewConstMetric(descKVCached, prometheus.GaugeValue, float64(st.KVBlocksCached), n)
	ch <- prometheus.MustNewConstMetric(descPrefixHit, prometheus.CounterValue, float64(st.CachedPromptTokens), n)
	ch <- prometheus.MustNewConstMetric(descDrafted, prometheus.CounterValue, float64(st.Drafted), n)
	ch <- prometheus.MustNewConstMetric(descAccepted, prometheus.CounterValue, float64(st.Accepted), n)
}

// collectEngine sends the replays and the member step times of model n,
// run across nodes by eng (nil: on a local runner, which never replays).
func collectEngine(ch chan<- prometheus.Metric, n string, eng *parallel.Engine) {
	var replays int64
	var pause time.Duration
	if eng != nil {
		replays, pause = eng.Replays()
	}
	ch <- prometheus.MustNewConstMetric(descReplays, prometheus.CounterValue, float64(replays), n)
	ch <- prometheus.MustNewConstMetric(descReplayLag, prometheus.GaugeValue, pause.Seconds(), n)
	if eng == nil {
		return
	}
	rs := eng.RemoteStats()
	ch <- prometheus.MustNewConstMetric(descRemote, prometheus.CounterValue, float64(rs.Prefills), n, "ok")
	ch <- prometheus.MustNewConstMetric(descRemote, prometheus.CounterValue, float64(rs.Failed), n, "failed")
	ch <- prometheus.MustNewConstMetric(descRemote, prometheus.CounterValue, float64(rs.Local), n, "local")
	ch <- prometheus.MustNewConstMetric(descRemoteTok, prometheus.CounterValue, float64(rs.Tokens), n)
	ch <- prometheus.MustNewConstMetric(descRemoteSec, prometheus.CounterValue, rs.Seconds, n)
	ch <- prometheus.MustNewConstMetric(descRemoteRun, prometheus.GaugeValue, float64(rs.Running), n)
	for _, p := range []struct {
		name string
		sec  float64
	}{{"queue", rs.Phases.Queue}, {"open", rs.Phases.Open}, {"step", rs.Phases.Step}, {"wait", rs.Phases.Wait}} {
		ch <- prometheus.MustNewConstMetric(descRemotePh, prometheus.CounterValue, p.sec, n, p.name)
	}
	for _, m := range eng.MemberSteps() {
		buckets := make(map[float64]uint64, len(parallel.StepBuckets))
		for i, b := range parallel.StepBuckets {
			buckets[b] = m.Buckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(descMemberMs, m.Count, m.Sum.Seconds(), buckets, n, m.Name)
	}
}
