package node

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"shoal/coordinator"
	"shoal/placement"
)

// fill sets every field of the struct v points to a non-zero value, so a
// field a conversion forgets shows up as a difference.
func fill(v any) {
	rv := reflect.ValueOf(v).Elem()
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(rv.Type().Field(i).Name)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(i + 1))
		case reflect.Uint64:
			f.SetUint(uint64(i + 1))
		case reflect.Float64:
			f.SetFloat(float64(i) + 0.5)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			if f.Type().Elem().Kind() == reflect.String {
				f.Set(reflect.ValueOf([]string{"a", "b"}))
			} else {
				f.Set(reflect.ValueOf([]int{i, i + 1}))
			}
		case reflect.Struct:
			if f.Type() == reflect.TypeOf(time.Time{}) {
				f.Set(reflect.ValueOf(time.Unix(int64(i), 0).UTC()))
			} else {
				fill(f.Addr().Interface())
			}
		case reflect.Pointer:
			t := time.Unix(int64(i), 0).UTC()
			f.Set(reflect.ValueOf(&t))
		}
	}
}

func jsonMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestWireTypesKeepTheJSON: the admin API's own types give the JSON the
// cluster state's types gave, so the CLI and other clients read it as
// before.
func TestWireTypesKeepTheJSON(t *testing.T) {
	var n coordinator.Node
	var tok coordinator.Token
	var m placement.Member
	var cost placement.Cost
	for _, v := range []any{&n, &tok, &m, &cost} {
		fill(v)
	}
	pm := jsonMap(t, m)
	pm["node_name"] = "box"
	for _, c := range []struct {
		name      string
		got, want map[string]any
	}{
		{"node", jsonMap(t, apiNode(&n)), jsonMap(t, n)},
		{"token", jsonMap(t, apiToken(&tok)), jsonMap(t, tok)},
		{"placement member", jsonMap(t, apiPlacementMember(m, "box")), pm},
		{"cost", jsonMap(t, apiCost(cost)), jsonMap(t, cost)},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, c.got, c.want)
		}
	}
}
