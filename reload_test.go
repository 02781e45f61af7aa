package compactcache

import (
	"net"
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

// TestReloadKeepsEachViewsCache: the blocks of two views of one address share
// their keys; a reload hands each its own store, and no client gets the
// other view's answer (split horizon).
func TestReloadKeepsEachViewsCache(t *testing.T) {
	const name = "v.example.org."
	ups := map[string]*upstream{}
	corefile := ""
	_, port, err := net.SplitHostPort(freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"127.0.0.1", "127.0.0.2"} {
		u := newUpstream()
		u.add(name, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(name + " 300 IN A 192.0.2." + client[len(client)-1:])}, nil, nil)
		ups[client] = u
		corefile += `.:` + port + ` {
	bind 127.0.0.1
	view from` + client[len(client)-1:] + ` {
		expr client_ip() == '` + client + `'
	}
	compactcache
	forward . ` + startUpstream(t, u) + `
}
`
	}
	serverMu.Lock()
	inst, err := caddy.Start(corefileInput(corefile))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { inst.Stop() }()
	for round := range 2 {
		for client, u := range ups {
			c := &dns.Client{Net: "udp", Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(client)}}}
			r, _, err := c.Exchange(test.Case{Qname: name, Qtype: dns.TypeA}.Msg(), net.JoinHostPort("127.0.0.1", port))
			if err != nil {
				t.Fatalf("round %d, from %s: %v", round, client, err)
			}
			want := "192.0.2." + client[len(client)-1:]
			if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != want {
				t.Errorf("round %d, from %s: %v, want %s, its view's", round, client, r.Answer, want)
			}
			if n := u.count(name, dns.TypeA); n != 1 {
				t.Errorf("round %d, from %s: its view's upstream asked %d times, want once: the cache kept", round, client, n)
			}
		}
		serverMu.Lock()
		inst, err = inst.Restart(corefileInput(corefile))
		serverMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestReloadContents: what changes the replies a store holds, or their keys,
// keeps a reload from handing the store over; what is read at hit time does
// not.
func TestReloadContents(t *testing.T) {
	base := mustParse(t, "compactcache").contents()
	for _, tc := range []struct {
		option string
		same   bool
	}{
		{"compactcache 600", false},
		{"compactcache {\n success 0 600\n}", false},
		{"compactcache {\n success 0 3600 60\n}", false},
		{"compactcache {\n denial 0 600\n}", false},
		{"compactcache {\n denial 0 1800 60\n}", false},
		{"compactcache {\n servfail 1s\n}", false},
		{"compactcache {\n disable success example.org\n}", false},
		{"compactcache {\n disable denial example.org\n}", false},
		{"compactcache {\n ecs 16\n}", false},
		{"compactcache {\n ecs 24 48 {\n  max_variants 5\n }\n}", false},
		{"compactcache {\n serve_stale\n serve_stale_policy prefer_positive\n}", false},
		{"compactcache {\n prefetch 5 1m 20%\n}", true},
		{"compactcache {\n keepttl\n}", true},
		{"compactcache {\n serve_stale 1h verify 1s\n}", true},
		{"compactcache example.org", true}, // zones are matched at request time
	} {
		if same := mustParse(t, tc.option).contents() == base; same != tc.same {
			t.Errorf("%q: contents the same as the default's: %v, want %v", tc.option, same, tc.same)
		}
	}
}
