package compactcache

import (
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestReloadKeepsTheCache reloads a running CoreDNS with changed Corefiles:
// a change that leaves the store's shape and what it holds keeps the
// entries; one that changes the budget, a TTL cap or what is disabled starts
// a new store.
func TestReloadKeepsTheCache(t *testing.T) {
	u := exampleUpstream()
	up := startUpstream(t, u)
	block := func(options string) string {
		return `.:0 {
	bind 127.0.0.1
	` + options + `
	forward . ` + up + `
}`
	}
	serverMu.Lock()
	inst, err := caddy.Start(corefileInput(block("compactcache")))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { inst.Stop() }()
	addr := inst.Servers()[0].LocalAddr().String()
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, addr, req)

	for _, step := range []struct {
		corefile string
		queries  int // upstream queries for the name after the reload's query
	}{
		{block("errors\n\tcompactcache"), 1},                                // another plugin: the same store
		{block("errors\n\tcompactcache {\n\t\tprefetch 5\n\t}"), 1},         // prefetch: the same store
		{block("errors\n\tcompactcache 600 {\n\t\tprefetch 5\n\t}"), 2},     // TTL cap: what is stored changes
		{block("errors\n\tcompactcache 600 {\n\t\tcapacity 32MiB\n\t}"), 3}, // budget: the store's shape changes
		// disable: nothing kept that it disables, and the answer no longer stored
		{block("errors\n\tcompactcache 600 {\n\t\tcapacity 32MiB\n\t\tdisable success\n\t}"), 4},
	} {
		serverMu.Lock()
		inst, err = inst.Restart(corefileInput(step.corefile))
		serverMu.Unlock()
		if err != nil {
			t.Fatalf("reload:\n%s\n%v", step.corefile, err)
		}
		addr = inst.Servers()[0].LocalAddr().String()
		if r, _ := exchangeUDP(t, addr, req); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("after reload:\n%s\nreply %v", step.corefile, r)
		}
		if n := u.count("a.example.org.", dns.TypeA); n != step.queries {
			t.Fatalf("after reload:\n%s\nupstream asked %d times, want %d", step.corefile, n, step.queries)
		}
	}
}
