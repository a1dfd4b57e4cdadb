package config

import (
	"strings"
	"testing"

	"shoal/coordinator"
)

// badNames are names no node may take: control characters (a terminal
// escape, a newline), spaces, slashes, quotes, too long.
var badNames = []string{"evil\x1b[31m", "a\nb", "two words", "../x", `q"uote`, "-lead", strings.Repeat("n", 64)}

// TestNodeNamesChecked: --name follows coordinator.CheckNodeName: a name
// with "\x1b[31m" or "\n" is refused by Validate (a server's join handler
// refuses it on the wire: node/identity's TestJoinNameChecked); the
// default name made from the host name always passes.
func TestNodeNamesChecked(t *testing.T) {
	for _, name := range badNames {
		c := Config{Name: name, DataDir: t.TempDir()}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--name") {
			t.Errorf("--name %q: %v, want refused", name, err)
		}
	}
	good := Config{Name: "mac-1.lan_2", DataDir: t.TempDir()}
	if err := good.Validate(); err != nil {
		t.Fatalf("--name %q: %v", good.Name, err)
	}

	for host, want := range map[string]string{
		"mac1":                  "mac1",
		"build.example.com":     "build.example.com",
		"Johns MacBook's Pro":   "Johns-MacBook-s-Pro",
		"höst":                  "h--st",
		"-dash":                 "dash",
		"":                      "node",
		"\x1b[31m":              "31m",
		strings.Repeat("a", 70): strings.Repeat("a", 63),
		strings.Repeat("b", 60) + ".very.long.domain.example.com": strings.Repeat("b", 60),
	} {
		got := nodeName(host)
		if got != want {
			t.Errorf("nodeName(%q) = %q, want %q", host, got, want)
		}
		if err := coordinator.CheckNodeName(got); err != nil {
			t.Errorf("nodeName(%q) = %q: %v", host, got, err)
		}
	}
	if err := coordinator.CheckNodeName(DefaultName()); err != nil {
		t.Errorf("the default name: %v", err)
	}
}
