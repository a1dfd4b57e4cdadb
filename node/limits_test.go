package node_test

import (
	"net/http"
	"strings"
	"testing"

	"shoal/api"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestMetricsNeedReadKey: /metrics names every model and peer address, so
// it answers 401 without a key (with the way to send one), 403 to an
// inference key, 200 to a read key and to the admin key; an agent started
// with --metrics-public serves it without a key.
func TestMetricsNeedReadKey(t *testing.T) {
	c := tc.New(t, 1)
	root := c.Client(0, tc.Secret)
	key := func(kind string) string {
		t.Helper()
		k, err := root.CreateToken(t.Context(), api.TokenRequest{Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		return k.Secret
	}
	read, infer := key(api.TokenRead), key(api.TokenInference)
	url := "http://" + c.Members[0].Agent.HTTPAddr() + "/metrics"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("no key: %d (WWW-Authenticate %q), want 401 asking for a bearer key", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	for _, x := range []struct {
		who, key string
		want     int
	}{{"no key", "", 401}, {"a wrong key", "not-a-key", 403}, {"an inference key", infer, 403}, {"a read key", read, 200}, {"the admin key", tc.Secret, 200}} {
		code, body := request(t, x.key, "GET", url, "")
		if code != x.want {
			t.Fatalf("/metrics with %s: %d %.200s, want %d", x.who, code, body, x.want)
		}
		if code == 200 && !strings.Contains(body, "shoal_raft_leader") {
			t.Fatalf("/metrics with %s: no shoal series in %.200s", x.who, body)
		}
		t.Logf("/metrics with %s: %d %.160s", x.who, code, body)
	}

	pub, err := c.AddWith("public", false, tc.Secret, func(cfg *node.Config) { cfg.MetricsPublic = true })
	if err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get("http://" + pub.Agent.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("--metrics-public, no key: %d, want 200", resp.StatusCode)
	}
}
