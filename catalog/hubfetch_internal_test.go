package catalog

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"shoal/hub"
	"shoal/hub/hubtest"
	"shoal/shard"
)

// The hub fetcher reads ranges at most hubBridge apart in one Range
// request and returns only the bytes asked for, also when the connection
// is cut inside a bridged run.
func TestHubFetcherBridgesSmallGaps(t *testing.T) {
	file := make([]byte, 200_000)
	for i := range file {
		file[i] = byte(i*7 + i>>8)
	}
	hs := hubtest.New(t)
	hs.AddRepo("o/r", map[string][]byte{"m.gguf": file})
	c := &hub.Client{Endpoint: hs.URL, Backoff: 10 * time.Millisecond}
	h := newHubFetcher(c, "hub:o/r/m.gguf@main")
	ranges := []shard.Range{
		{Off: 100, N: 1000},                // run 1
		{Off: 1100, N: 50},                 // adjacent
		{Off: 2000, N: 3000},               // 850 bytes on: bridged
		{Off: 5000 + hubBridge + 1, N: 10}, // too far: run 2
		{Off: 150_000, N: 40_000},          // run 3
	}
	var want []byte
	for _, r := range ranges {
		want = append(want, file[r.Off:r.End()]...)
	}
	for _, cut := range []int64{-1, 1500} { // whole, then cut inside the bridge
		if cut >= 0 {
			hs.CutOnce("o/r", "m.gguf", cut)
		}
		before := len(hs.Requests())
		rc, err := h.(shard.BatchFetcher).FetchRanges(context.Background(), "", ranges)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("cut %d: %d bytes (want %d), equal %v, %v", cut, len(got), len(want), bytes.Equal(got, want), err)
		}
		n := 0
		for _, r := range hs.Requests()[before:] {
			if r.Status == http.StatusPartialContent {
				n++
			}
		}
		if want := 3 + min(int(cut+1), 1); n != want {
			t.Errorf("cut %d: %d range requests, want %d", cut, n, want)
		}
	}
}
