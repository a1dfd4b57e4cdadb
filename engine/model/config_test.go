package model

import (
	"slices"
	"strings"
	"testing"
)

// TestRegisterRefusesDuplicates: a second registration of a name panics
// and leaves the first one in place; so does a registration without a name.
func TestRegisterRefusesDuplicates(t *testing.T) {
	before := archs["llama"]
	for _, a := range []Arch{{Name: "llama", Rope: RopeNeoX}, {Name: ""}} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "model: Register") {
					t.Errorf("Register(%+v) did not panic with a clear message (recovered %q)", a, msg)
				}
			}()
			Register(a)
		}()
	}
	if archs["llama"] != before {
		t.Errorf("llama is now %+v, was %+v", archs["llama"], before)
	}
	if slices.Contains(Archs(), "") {
		t.Error("an architecture without a name was registered")
	}
}
