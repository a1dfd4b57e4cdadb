package nodeaddr

import "testing"

func TestTagSplit(t *testing.T) {
	for _, c := range []struct{ id, addr string }{{"0b1c-id", "10.0.0.1:7947"}, {"", "127.0.0.1:1"}, {"n", "[::1]:7947"}} {
		id, addr := Split(Tag(c.id, c.addr))
		if id != c.id || addr != c.addr {
			t.Errorf("Split(Tag(%q, %q)) = %q, %q", c.id, c.addr, id, addr)
		}
	}
}
