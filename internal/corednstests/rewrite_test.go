package main

import (
	"go/format"
	"slices"
	"strings"
	"testing"
)

// The file holds what CoreDNS's tests have, and the words around them that
// must stay: a Go variable named cache, comments, an import path, names that
// contain the word, and strings that are not Corefiles.
const before = `package test

import (
	"strings"

	_ "github.com/coredns/coredns/plugin/cache"
)

// The cache directive below is switched; this comment is not.
const shared = ` + "`" + `example.org:0 {
	cache
}` + "`" + `

func TestA(t *testing.T) {
	corefile := ` + "`" + `example.org:0 {
		forward . 127.0.0.1:53
		cache 10
		cache.example.org
	}
	cache.example.com:0 {
		cache {
			success 1000 1 0
		}
		compactcache
		no-cache
		log . "cache {rcode}"
	}` + "`" + `
	cache := ""
	if true {
		cache = "\n\tcache 30"
	}
	bad := strings.Replace(corefile, "\n\t\tcache", "\n\t\tfile\n\t\tcache", 1)
	t.Log("cache", cache, bad, "cache 10")
}
`

const after = `package test

import (
	"strings"

	_ "github.com/coredns/coredns/plugin/cache"
)

// The cache directive below is switched; this comment is not.
const shared = ` + "`" + `example.org:0 {
	compactcache
}` + "`" + `

func TestA(t *testing.T) {
	corefile := ` + "`" + `example.org:0 {
		forward . 127.0.0.1:53
		compactcache 10
		cache.example.org
	}
	cache.example.com:0 {
		compactcache {
			success 1000 1 0
		}
		compactcache
		no-cache
		log . "cache {rcode}"
	}` + "`" + `
	cache := ""
	if true {
		cache = "\n\tcompactcache 30"
	}
	bad := strings.Replace(corefile, "\n\t\tcompactcache", "\n\t\tfile\n\t\tcompactcache", 1)
	t.Log("cache", cache, bad, "cache 10")
}
`

func TestSwitchDirective(t *testing.T) {
	out, n, funcs, err := switchDirective("a_test.go", []byte(before))
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != after {
		t.Errorf("got\n%s\nwant\n%s", out, after)
	}
	if n != 6 {
		t.Errorf("%d switched, want 6", n)
	}
	if want := []string{"", "TestA", "TestA", "TestA", "TestA", "TestA"}; !slices.Equal(funcs, want) {
		t.Errorf("in %q, want %q", funcs, want)
	}
	// A second pass finds nothing: compactcache is not cache.
	if _, n, _, err := switchDirective("a_test.go", out); err != nil || n != 0 {
		t.Errorf("second pass: %d switched, %v", n, err)
	}
}

func TestSwitchDirectiveNone(t *testing.T) {
	src := "package test\n\nconst c = `.:0 {\n\twhoami\n}`\n"
	out, n, _, err := switchDirective("b_test.go", []byte(src))
	if err != nil || n != 0 || string(out) != src {
		t.Errorf("got %d switched, %v, source changed: %v", n, err, string(out) != src)
	}
}

func TestRegistrationFile(t *testing.T) {
	b := registrationFile("test")
	formatted, err := format.Source(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(formatted) != string(b) {
		t.Errorf("not gofmt'ed:\n%s", b)
	}
	if !strings.Contains(string(b), "\npackage test\n") {
		t.Errorf("package clause missing:\n%s", b)
	}
}

func TestExpand(t *testing.T) {
	tests := map[string]testFunc{
		"TestMetricsServer": {}, "TestMetricsAuto": {}, "TestMetrics": {},
		"TestLookupCache": {}, "TestLookupCacheWithoutEdns": {}, "TestOther": {},
	}
	got, err := expand([]string{"TestLookupCache*", "TestLookupCacheWithoutEdns", "TestMetrics*"}, tests)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"TestLookupCache", "TestLookupCacheWithoutEdns", "TestMetrics", "TestMetricsAuto", "TestMetricsServer"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := expand([]string{"TestGone"}, tests); err == nil {
		t.Error("a pattern that matches no test was taken")
	}
}

func TestAnchored(t *testing.T) {
	if got, want := anchored([]string{"TestA", "TestB.c"}), `^(TestA|TestB\.c)$`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
