package main

import (
	"slices"
	"strings"
	"testing"
)

// goTestJSON is go test -json output, cut down from a real run, with one test
// of each outcome.
const goTestJSON = `{"Action":"start","Package":"corednstests"}
{"Action":"run","Package":"corednstests","Test":"TestPass"}
{"Action":"output","Package":"corednstests","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"corednstests","Test":"TestPass","Output":"--- PASS: TestPass (0.00s)\n"}
{"Action":"pass","Package":"corednstests","Test":"TestPass","Elapsed":0}
{"Action":"run","Package":"corednstests","Test":"TestLookupCache"}
{"Action":"output","Package":"corednstests","Test":"TestLookupCache","Output":"=== RUN   TestLookupCache\n"}
{"Action":"run","Package":"corednstests","Test":"TestLookupCache/Short_TTL"}
{"Action":"output","Package":"corednstests","Test":"TestLookupCache/Short_TTL","Output":"=== RUN   TestLookupCache/Short_TTL\n"}
{"Action":"output","Package":"corednstests","Test":"TestLookupCache/Short_TTL","Output":"    cache_test.go:51: Expected TTL to be 5, got 1\n"}
{"Action":"output","Package":"corednstests","Test":"TestLookupCache/Short_TTL","Output":"        and a second line\n"}
{"Action":"output","Package":"corednstests","Test":"TestLookupCache/Short_TTL","Output":"--- FAIL: TestLookupCache/Short_TTL (0.00s)\n"}
{"Action":"fail","Package":"corednstests","Test":"TestLookupCache/Short_TTL","Elapsed":0}
{"Action":"run","Package":"corednstests","Test":"TestLookupCache/Long_TTL"}
{"Action":"pass","Package":"corednstests","Test":"TestLookupCache/Long_TTL","Elapsed":0}
{"Action":"output","Package":"corednstests","Test":"TestLookupCache","Output":"--- FAIL: TestLookupCache (0.01s)\n"}
{"Action":"fail","Package":"corednstests","Test":"TestLookupCache","Elapsed":0.01}
{"Action":"run","Package":"corednstests","Test":"TestSkips"}
{"Action":"output","Package":"corednstests","Test":"TestSkips","Output":"    x_test.go:9: no etcd\n"}
{"Action":"skip","Package":"corednstests","Test":"TestSkips","Elapsed":0}
{"Action":"run","Package":"corednstests","Test":"TestHangs"}
{"Action":"output","Package":"corednstests","Test":"TestHangs","Output":"panic: test timed out after 20m0s\n"}
not json: go test's own
{"Action":"output","Package":"corednstests","Output":"FAIL\tcorednstests\t0.035s\n"}
{"Action":"fail","Package":"corednstests","Elapsed":0.035}
`

func TestJudge(t *testing.T) {
	var rs results
	var ended []string
	progress := func(name string, res *result) { ended = append(ended, name+" "+res.action) }
	if err := rs.read(strings.NewReader(goTestJSON), progress, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"TestPass pass", "TestLookupCache fail", "TestSkips skip"}; !slices.Equal(ended, want) {
		t.Errorf("progress %q, want %q", ended, want)
	}
	got := map[string]verdict{}
	for _, v := range rs.judge([]string{"TestPass", "TestLookupCache", "TestSkips", "TestHangs", "TestAbsent"}) {
		got[v.name] = v
	}
	for _, want := range []verdict{
		{name: "TestPass", ok: true, status: "PASS"},
		{name: "TestLookupCache", status: "FAIL", reasons: []string{
			"TestLookupCache/Short_TTL:",
			"  cache_test.go:51: Expected TTL to be 5, got 1",
			"    and a second line",
		}},
		{name: "TestSkips", status: "SKIP", reasons: []string{"skipped itself:", "x_test.go:9: no etcd"}},
		{name: "TestHangs", status: "NO RESULT"},
		{name: "TestAbsent", status: "NOT RUN", reasons: []string{"go test did not start it"}},
	} {
		v := got[want.name]
		if v.ok != want.ok || v.status != want.status {
			t.Errorf("%s: ok %v, %s; want ok %v, %s", want.name, v.ok, v.status, want.ok, want.status)
		}
		if want.reasons != nil && !slices.Equal(v.reasons, want.reasons) {
			t.Errorf("%s: reasons %q, want %q", want.name, v.reasons, want.reasons)
		}
	}
	if r := got["TestHangs"].reasons; len(r) < 2 || !strings.Contains(r[len(r)-1], "panic: test timed out") {
		t.Errorf("TestHangs: reasons %q, want the panic", r)
	}
	if want := []string{"not json: go test's own"}; !slices.Equal(rs.otherOutput(), want) {
		t.Errorf("other output %q, want %q", rs.otherOutput(), want)
	}
}
