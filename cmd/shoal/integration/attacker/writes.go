package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"shoal/coordinator"
	"shoal/transport"
)

// readState reads the state (a client node's copy: no token hashes) from
// the server call reaches.
func readState(ctx context.Context, call caller) *coordinator.State {
	var st coordinator.State
	if err := call(ctx, coordinator.MethodState, nil, &st); err != nil {
		fail(fmt.Sprintf("state: %v", err))
	}
	return &st
}

// modelBomb writes, as a report about a model file the attacker's node
// holds, a model whose profile claims 2^40 routed experts (of no bytes,
// so the model "fits"): a planner that believes it allocates per expert.
// It is sent bare (a client node's own report) and relaying the
// operator's admin key (o.key, as a phished key would be).
func modelBomb(ctx context.Context, o opts) []attempt {
	ep, ident := endpoint(o.tlsDir, o.bind, 0)
	defer ep.Close()
	call := func(ctx context.Context, method string, in, out any) error {
		return transport.Call(ctx, ep, o.server, transport.KindRPC, method, in, out)
	}
	st := readState(ctx, call)
	tmpl := st.Models[o.model]
	if tmpl == nil || tmpl.Profile == nil {
		fail(fmt.Sprintf("no model %q with a profile in the state to copy", o.model))
	}
	prof := *tmpl.Profile
	prof.Layers = append(prof.Layers[:0:0], prof.Layers...)
	prof.NExpert, prof.NExpertUsed = 1<<40, 1
	var digest [32]byte
	_, _ = rand.Read(digest[:])
	m := coordinator.Model{
		Name: o.name, Source: "/nonexistent/" + o.name + ".gguf", Digest: hex.EncodeToString(digest[:]),
		Layers: tmpl.Layers, Bytes: tmpl.Bytes, CreatedAt: time.Now().UTC(),
		SourceNode: ident.ID, Profile: &prof,
	}
	body, _ := json.Marshal(coordinator.ModelUpsertRequest{Model: m})
	var out []attempt
	vs := []variant{{name: "own report"}}
	if o.key != "" {
		vs = append(vs, variant{name: "relayed with the admin key", key: o.key})
	}
	for _, v := range vs {
		err := call(ctx, coordinator.MethodApply, coordinator.ApplyRequest{Type: coordinator.ModelUpsertType, Body: body, Key: v.key}, nil)
		out = append(out, outcome("model with 2^40 experts, "+v.name, err))
	}
	return out
}

// unknownType proposes commands of a type no server knows (99), also
// marked skippable (99|128), relaying the admin key.
func unknownType(ctx context.Context, o opts) []attempt {
	call := dial(o.tlsDir, o.bind, o.server)
	var out []attempt
	for _, t := range []coordinator.MessageType{99, 99 | coordinator.IgnoreUnknownTypeFlag} {
		err := call(ctx, coordinator.MethodApply, coordinator.ApplyRequest{Type: t, Body: json.RawMessage(`{"x":1}`), Key: o.key}, nil)
		out = append(out, outcome(fmt.Sprintf("type %d with the admin key", t), err))
	}
	return out
}

// joinRequest and joinResponse are the join stream's messages (node's
// joinRequest and joinResponse).
type joinRequest struct {
	Token     string `json:"token"`
	NodeID    string `json:"node_id"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	PublicKey []byte `json:"public_key"`
}

type joinResponse struct {
	NodeID string `json:"node_id,omitempty"`
	Err    string `json:"err,omitempty"`
	Code   int    `json:"code,omitempty"`
	Cert   []byte `json:"cert,omitempty"`
}

// joinAs asks o.server to admit a client node named o.name with the join
// token o.token, as a node without a certificate does.
func joinAs(ctx context.Context, o opts) []attempt {
	parts := strings.Split(o.token, ".")
	if len(parts) != 3 {
		fail("join: --token is not ID.secret.CA-hash")
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		fail(err.Error())
	}
	req, _ := json.Marshal(joinRequest{Token: o.token, NodeID: newID(), Name: o.name, Role: coordinator.RoleClient, PublicKey: pub})
	name := fmt.Sprintf("join as %q", o.name)
	st, done, err := transport.DialPinned(ctx, o.server, "sha256:"+parts[2], transport.KindJoin, 3*time.Second)
	if err != nil {
		return []attempt{{Name: name, Code: -1, Err: err.Error()}}
	}
	defer done()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	if err := transport.WriteFrame(st, req); err != nil {
		return []attempt{{Name: name, Code: -1, Err: err.Error()}}
	}
	_ = st.CloseWrite()
	b, err := transport.ReadFrame(st, 64<<10)
	if err != nil {
		return []attempt{{Name: name, Code: -1, Err: err.Error()}}
	}
	var resp joinResponse
	if err := json.Unmarshal(b, &resp); err != nil {
		return []attempt{{Name: name, Code: -1, Err: "malformed answer"}}
	}
	if resp.Err == "" && len(resp.Cert) == 0 {
		resp.Err, resp.Code = "no certificate and no error", -1
	}
	if resp.Err != "" && resp.Code == 0 {
		resp.Code = -1
	}
	return []attempt{{Name: name, Code: resp.Code, Err: resp.Err}}
}

// newID is a random node ID in the agents' UUID form.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		fail(err.Error())
	}
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
