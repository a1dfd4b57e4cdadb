package dashboard_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"shoal/api"
	"shoal/engine/enginetest"
	"shoal/node"
	"shoal/node/nodetest"
)

// chromePath finds a Chromium or Chrome binary ($SHOAL_CHROME first).
func chromePath() string {
	if p := os.Getenv("SHOAL_CHROME"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestDashboardInBrowser loads the dashboard of a serving agent in headless
// Chromium: a refused key brings the key form back, the right one fills
// the node, model and recent-request tables and the token counters, the
// live tokens/s rises while requests run, and the key survives a reload.
func TestDashboardInBrowser(t *testing.T) {
	chrome := chromePath()
	if chrome == "" {
		t.Skip("no Chromium binary found (Debian: apt-get install chromium; or set SHOAL_CHROME): dashboard browser test skipped")
	}
	agent, base := startAgent(t)
	gen := complete(t, base, "Once upon a time", 16) + complete(t, base, "In a hole in the ground", 16)

	bctx := headless(t, chrome)
	ctx := bctx

	poll := func(expr string, d time.Duration) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(d))
	}
	err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/?interval=250"),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), "not-the-key"),
		chromedp.Click(chromedp.ID("key-save")),
		poll(`!document.getElementById('key-dialog').hidden && document.getElementById('key-error').textContent !== ''`, 15*time.Second),
	)
	if err != nil {
		t.Fatalf("a refused key did not bring the key form back: %v", err)
	}
	keyErr, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID("key-error")))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("refused key: %q", keyErr)

	filled := `(() => {
		const q = (s) => document.querySelector(s);
		return !!q('#nodes tr[data-node="` + nodeName + `"]') && !!q('#models tr[data-model="` + modelName + `"]') &&
			!!q('#requests tr[data-seq]') && Number(q('#gen-total').textContent.replace(/,/g, '')) > 0 &&
			!!q('#traffic tr[data-model="` + modelName + `"]');
	})()`
	type pageText struct{ Nodes, Models, Requests, Gen, Health, Rate, Traffic string }
	read := func() pageText {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[pageText](`(() => {
			const q = (s) => document.querySelector(s).textContent;
			return {Nodes: q('#nodes tbody'), Models: q('#models tbody'), Requests: q('#requests tbody'),
				Gen: q('#gen-total'), Health: q('#health'), Rate: q('#tok-s'), Traffic: q('#traffic tbody')};
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	err = chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.ID("api-key"), nodetest.Secret),
		chromedp.Click(chromedp.ID("key-save")),
		poll(filled, 20*time.Second),
	)
	if err != nil {
		main, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("the dashboard did not fill: %v\npage:\n%s", err, main)
	}
	pg := read()
	t.Logf("nodes: %q\nmodels: %q\nrequests: %q\ngenerated: %s, health %s", pg.Nodes, pg.Models, pg.Requests, pg.Gen, pg.Health)
	if !strings.Contains(pg.Nodes, nodeName) || !strings.Contains(pg.Nodes, "alive") || !strings.Contains(pg.Nodes, "leader") {
		t.Errorf("nodes table %q lacks the node, its status or its raft role", pg.Nodes)
	}
	if !strings.Contains(pg.Models, modelName) || !strings.Contains(pg.Models, "plan v1: [0,2)@"+nodeName) {
		t.Errorf("models table %q lacks the model, its serving node or its plan", pg.Models)
	}
	if n, _ := strconv.Atoi(strings.ReplaceAll(pg.Gen, ",", "")); n != gen {
		t.Errorf("generated tokens shows %q, want %d (the completions' usage)", pg.Gen, gen)
	}
	if !strings.Contains(pg.Traffic, modelName) || !strings.Contains(pg.Traffic, strconv.Itoa(gen)) {
		t.Errorf("cluster traffic %q lacks the model or its %d generated tokens", pg.Traffic, gen)
	}
	if !strings.Contains(pg.Requests, "completions") || !strings.Contains(pg.Requests, modelName) || !strings.Contains(pg.Requests, "200") {
		t.Errorf("recent requests %q lack the completions", pg.Requests)
	}
	if pg.Health != "healthy" {
		t.Errorf("health badge %q, want healthy", pg.Health)
	}

	// A model loaded with `model load` shows up as the --model one does:
	// a row with its one-node plan on this agent.
	loaded := enginetest.Tiny
	loaded.Name, loaded.Seed = "loaded", 7
	if _, err := api.NewClient(agent.HTTPAddr(), nodetest.Secret).LoadModel(ctx, api.LoadModelRequest{
		Path: enginetest.Write(t, t.TempDir(), loaded), Name: loaded.Name}); err != nil {
		t.Fatal(err)
	}
	planCell := func(model string) string {
		return `(document.querySelector('#models tr[data-model="` + model + `"] td.placement') || {}).textContent || ''`
	}
	if err := chromedp.Do(bctx, poll(planCell(loaded.Name)+`.startsWith('plan v1: [0,2)@`+nodeName+`')`, 30*time.Second)); err != nil {
		t.Fatalf("the loaded model has no row with its plan: %v (models %q)", err, read().Models)
	}
	cells, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[`+planCell(modelName)+`, `+planCell(loaded.Name)+`]`))
	if err != nil {
		t.Fatal(err)
	}
	if strip := func(s string) string { before, _, _ := strings.Cut(s, " ("); return before }; strip(cells[0]) != strip(cells[1]) {
		t.Errorf("the --model and the loaded model show different plans: %q, %q", cells[0], cells[1])
	}

	// Live tokens/s: keep the model busy until a scrape sees it working.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			complete(t, base, "Tell me a story", 64)
		}
	}()
	err = chromedp.Do(bctx, poll(`Number(document.getElementById('tok-s').textContent.replace(/,/g, '')) > 0`, 15*time.Second))
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("tokens/s never rose above 0 while requests ran: %v", err)
	}
	t.Logf("live tokens/s: %s", read().Rate)

	// The key is remembered: a reload goes straight to the data.
	err = chromedp.Do(bctx, chromedp.Reload(), poll(filled, 15*time.Second))
	if err != nil {
		t.Fatalf("after a reload: %v", err)
	}
	hidden, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById('key-dialog').hidden`))
	if err != nil || !hidden {
		t.Fatalf("after a reload the key form shows (err %v): the key was not kept", err)
	}
}

// TestDashboardInBrowserOverHTTPS loads the dashboard of an agent serving
// HTTPS in headless Chromium that trusts the cluster's HTTPS CA the way a
// person's browser would: the CA is imported into the NSS database of the
// browser's home (certutil), with no certificate error ignored. The page
// fills with the node and its model once given the key. The same browser
// without the CA refuses the page, so the trust is what makes it load.
func TestDashboardInBrowserOverHTTPS(t *testing.T) {
	chrome := chromePath()
	if chrome == "" {
		t.Skip("no Chromium binary found (Debian: apt-get install chromium; or set SHOAL_CHROME): dashboard HTTPS browser test skipped")
	}
	certutil, err := exec.LookPath("certutil")
	if err != nil {
		t.Skip("no certutil to give Chromium the cluster's HTTPS CA (Debian: apt-get install libnss3-tools): dashboard HTTPS browser test skipped")
	}
	var dataDir string
	_, base := startAgentWith(t, func(c *node.Config) { c.HTTPS = node.HTTPSOn; dataDir = c.DataDir })
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("agent forced to HTTPS serves %s", base)
	}

	// browser starts Chromium with home as HOME; trustCA imports the CA
	// into that home's NSS database.
	browser := func(ctx context.Context, home string) (context.Context, context.CancelFunc) {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.Env("HOME="+home), chromedp.UserDataDir(filepath.Join(home, "profile")))
		actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
		bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
		return bctx, func() { bcancel(); acancel() }
	}
	trusting := t.TempDir()
	nssdb := "sql:" + filepath.Join(trusting, ".pki", "nssdb")
	if err := os.MkdirAll(filepath.Join(trusting, ".pki", "nssdb"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-d", nssdb, "-N", "--empty-password"},
		{"-d", nssdb, "-A", "-t", "C,,", "-n", "shoal cluster HTTPS CA", "-i", node.HTTPSCAPath(dataDir)},
	} {
		if out, err := exec.Command(certutil, args...).CombinedOutput(); err != nil {
			t.Fatalf("certutil %v: %v\n%s", args, err, out)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	// Without the CA the page does not load.
	uctx, ucancel := browser(ctx, t.TempDir())
	err = chromedp.Do(uctx, chromedp.Navigate(base+"/"))
	ucancel()
	if err == nil || !strings.Contains(err.Error(), "ERR_CERT") {
		t.Fatalf("a browser without the cluster's HTTPS CA: %v, want a certificate error", err)
	}
	t.Logf("without the CA: %v", err)

	bctx, bcancel := browser(ctx, trusting)
	defer bcancel()
	filled := `(() => {
		const q = (s) => document.querySelector(s);
		return !!q('#nodes tr[data-node="` + nodeName + `"]') && !!q('#models tr[data-model="` + modelName + `"]') &&
			document.getElementById('health').textContent === 'healthy';
	})()`
	err = chromedp.Do(bctx,
		chromedp.Navigate(base+"/?interval=250"),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), nodetest.Secret),
		chromedp.Click(chromedp.ID("key-save")),
		chromedp.Poll[chromedp.Void](filled, chromedp.WithPollingTimeout(20*time.Second)),
	)
	if err != nil {
		main, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("the dashboard over HTTPS did not fill: %v\npage:\n%s", err, main)
	}
	proto, err := chromedp.Run(bctx, chromedp.Evaluate[string](`location.protocol`))
	if err != nil || proto != "https:" {
		t.Fatalf("page protocol %q (%v), want https:", proto, err)
	}
	nodes, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#nodes tbody")))
	t.Logf("dashboard over HTTPS: nodes %q", nodes)
}

// TestDashboardLinks: the links table shows this agent's traffic with each
// peer of a two-server cluster (QUIC's own counts: in-process agents load
// no eBPF), with what was sent and received.
func TestDashboardLinks(t *testing.T) {
	chrome := chromePath()
	if chrome == "" {
		t.Skip("no Chromium binary found (Debian: apt-get install chromium; or set SHOAL_CHROME): dashboard browser test skipped")
	}
	c := nodetest.New(t, 2)
	c.Leader(20 * time.Second)
	a := c.Members[0].Agent
	peer := c.Members[1].Cfg.Name
	bctx := headless(t, chrome)
	row := `document.querySelector('#links tr[data-peer="` + peer + `"]')`
	err := chromedp.Do(bctx,
		chromedp.Navigate(a.HTTPURL()+"/?interval=250"),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), nodetest.Secret),
		chromedp.Click(chromedp.ID("key-save")),
		chromedp.Poll[chromedp.Void](`!!`+row+` && `+row+`.children[3].textContent.endsWith('B')`, chromedp.WithPollingTimeout(30*time.Second)),
	)
	if err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text(chromedp.ID("links")))
		t.Fatalf("no link row for %s with bytes sent: %v\nlinks: %s", peer, err, body)
	}
	text, err := chromedp.Run(bctx, chromedp.Evaluate[string](row+`.textContent`))
	if err != nil {
		t.Fatal(err)
	}
	note, _ := chromedp.Run(bctx, chromedp.Text(chromedp.ID("links-note")))
	t.Logf("link row: %q (%s)", text, note)
	if !strings.Contains(note, "quic") {
		t.Errorf("links note %q does not name the counting source", note)
	}
}

// headless starts headless Chromium for a test, closed at its end.
func headless(t *testing.T, chrome string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	t.Cleanup(cancel)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(bcancel)
	return bctx
}
