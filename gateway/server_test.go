package gateway_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"shoal/gateway"
	"shoal/transport"
)

// rawCall sends frame (or, with announce > 0, only a length prefix of
// announce bytes) on a fresh gateway stream to ep and returns the head of
// the answer.
func rawCall(t *testing.T, from, to *transport.Endpoint, frame []byte, announce uint32) gateway.Head {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := from.Dial(ctx, to.Addr().String(), transport.KindGateway)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	if announce > 0 {
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], announce)
		_, err = st.Write(hdr[:])
	} else {
		err = transport.WriteFrame(st, frame)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := transport.ReadFrame(st, 64<<10)
	if err != nil {
		t.Fatalf("no answer head: %v", err)
	}
	var h gateway.Head
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("answer head %q: %v", b, err)
	}
	return h
}

// TestBadRequestFrames: an oversized or malformed request frame, or one
// of another version, gets a clear error head, and the driver goes on
// serving.
func TestBadRequestFrames(t *testing.T) {
	ca, _ := transport.DeriveCA(secret)
	a, _ := driver(t, ca, "driver-a", writeModel(t))
	from := endpoint(t, ca, "front")
	for _, c := range []struct {
		name     string
		frame    string
		announce uint32
		want     string
	}{
		{"oversized", "", gateway.MaxRequestFrame + 1, "frame too large"},
		{"malformed", `{"v":1,"op":`, 0, "malformed request frame"},
		{"version", `{"v":9,"op":"generate","model":"x","prompt":[1]}`, 0, "version 9"},
		{"negative token", `{"v":1,"op":"generate","model":"x","prompt":[1,-2]}`, 0, "negative token id"},
		{"outside the vocabulary", `{"v":1,"op":"generate","model":"x","prompt":[1,99999999]}`, 0, "outside the vocabulary"},
		{"unknown model", `{"v":1,"op":"generate","model":"nosuch","prompt":[1]}`, 0, "nosuch is not driven"},
		{"bad grammar", `{"v":1,"op":"generate","model":"x","prompt":[1],"constraint":{"grammar":"root ::= ("}}`, 0, "constraint"},
	} {
		h := rawCall(t, from, a, []byte(c.frame), c.announce)
		if h.Err == nil || !strings.Contains(h.Err.Msg, c.want) {
			t.Errorf("%s: head %+v, want an error saying %q", c.name, h.Err, c.want)
		}
	}
	// Still serving.
	h := rawCall(t, from, a, []byte(`{"v":1,"op":"generate","model":"x","prompt":[1,2,3],"max_tokens":2}`), 0)
	if h.Err != nil || h.Capacity <= 0 {
		t.Fatalf("a good request after the bad ones: %+v", h)
	}
}
