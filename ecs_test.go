package compactcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// geoUpstream answers TXT questions by client subnet, as an authoritative
// server with ECS does. The first label of the name sets the scope it
// answers with ("s16.geo." answers with scope /16); the answer names the
// network it was chosen for: the address it was sent, masked to the smaller
// of the source prefix and that scope.
type geoUpstream struct {
	mu      sync.Mutex
	queries map[string]int
	sources []string // the ECS of each query, as "addr/source"
	forge   func(e *dns.EDNS0_SUBNET)
}

func newGeoUpstream() *geoUpstream { return &geoUpstream{queries: map[string]int{}} }

func geoScope(name string) uint8 {
	n, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(name, ".", 2)[0], "s"))
	return uint8(n)
}

func (g *geoUpstream) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	q := r.Question[0]
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	network := "none"
	var echo *dns.EDNS0_SUBNET
	if e := dnsmsg.Subnet(r); e != nil {
		scope := geoScope(q.Name)
		p, _ := netip.AddrFromSlice(e.Address)
		if e.Family == dnsmsg.FamilyIPv4 {
			p = p.Unmap()
		}
		pfx, _ := p.Prefix(int(min(e.SourceNetmask, scope)))
		network = pfx.String()
		echo = &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: e.Family, SourceNetmask: e.SourceNetmask, SourceScope: scope, Address: e.Address}
		if g.forge != nil {
			g.forge(echo)
		}
		g.mu.Lock()
		g.sources = append(g.sources, fmt.Sprintf("%s/%d", e.Address, e.SourceNetmask))
		g.mu.Unlock()
	}
	m.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300}, Txt: []string{network}}}
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
		if echo != nil {
			m.IsEdns0().Option = []dns.EDNS0{echo}
		}
	}
	g.mu.Lock()
	g.queries[strings.ToLower(q.Name)]++
	g.mu.Unlock()
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func (g *geoUpstream) Name() string { return "geo" }

func (g *geoUpstream) count(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queries[name]
}

// geoQuery is a TXT query for name from a client that sends ECS subnet (""
// for none).
func geoQuery(name, subnet string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeTXT)
	m.SetEdns0(1232, false)
	if subnet != "" {
		p := netip.MustParsePrefix(subnet)
		e := &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: dnsmsg.FamilyIPv4, SourceNetmask: uint8(p.Bits()), Address: net.IP(p.Masked().Addr().AsSlice())}
		if p.Addr().Is6() {
			e.Family = dnsmsg.FamilyIPv6
		}
		m.IsEdns0().Option = []dns.EDNS0{e}
	}
	return m
}

// geoAnswer returns the network an answer names and the ECS echoed with it.
func geoAnswer(t *testing.T, m *dns.Msg) (string, *dns.EDNS0_SUBNET) {
	t.Helper()
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("reply %v", m)
	}
	return m.Answer[0].(*dns.TXT).Txt[0], dnsmsg.Subnet(m)
}

func newGeoCache(t *testing.T, corefile string, g *geoUpstream, clk *clock) *Cache {
	t.Helper()
	c := mustParse(t, corefile)
	c.Next, c.now = g, clk.now
	t.Cleanup(func() { c.refreshes.shutdown(time.Second) })
	return c
}

func TestECSVariants(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache", g, newClock())
	for _, step := range []struct {
		name, subnet string
		network      string // the answer's network
		scope        uint8  // echoed
		queries      int    // upstream queries for the name so far
	}{
		{"s16.geo.", "10.1.2.0/24", "10.1.0.0/16", 16, 1},
		{"s16.geo.", "10.1.9.0/24", "10.1.0.0/16", 16, 1}, // same /16
		{"s16.geo.", "10.2.0.0/24", "10.2.0.0/16", 16, 2},
		{"s16.geo.", "10.1.0.0/16", "10.1.0.0/16", 16, 2},  // a /16 source is enough
		{"s16.geo.", "10.1.0.0/8", "10.0.0.0/8", 32, 3},    // a shorter source is not: serves /8 queries only
		{"s24.geo.", "10.1.1.77/32", "10.1.1.0/24", 24, 1}, // source cut to /24 upstream, echoed /32
		{"s24.geo.", "10.1.1.0/24", "10.1.1.0/24", 24, 1},
		{"s24.geo.", "10.1.2.0/24", "10.1.2.0/24", 24, 2},
		{"s32.geo.", "10.1.1.5/32", "10.1.1.0/24", 24, 1}, // scope beyond source: stored for the source
		{"s32.geo.", "10.1.1.9/32", "10.1.1.0/24", 24, 1},
		{"s0.geo.", "10.1.1.0/24", "0.0.0.0/0", 0, 1}, // scope /0: for everyone
		{"s0.geo.", "192.0.2.0/24", "0.0.0.0/0", 0, 1},
		{"s16.geo.", "2001:db8:1:2::/64", "2001::/16", 16, 4}, // another family
		{"s48.geo.", "2001:db8:1:2::/64", "2001:db8:1::/48", 48, 1},
		{"s48.geo.", "2001:db8:1:ff::/64", "2001:db8:1::/48", 48, 1},
		{"s64.geo.", "2001:db8:1:2::/64", "2001:db8:1::/56", 56, 1}, // cut to /56
	} {
		network, echo := geoAnswer(t, ask(t, c, geoQuery(step.name, step.subnet), false))
		p := netip.MustParsePrefix(step.subnet)
		if network != step.network || echo == nil || echo.SourceScope != step.scope || int(echo.SourceNetmask) != p.Bits() ||
			!net.IP(p.Masked().Addr().AsSlice()).Equal(echo.Address) {
			t.Errorf("%s from %s: answer for %s, ECS %v; want %s with scope %d and the client's source", step.name, step.subnet, network, echo, step.network, step.scope)
		}
		if n := g.count(step.name); n != step.queries {
			t.Errorf("%s from %s: upstream asked %d times, want %d", step.name, step.subnet, n, step.queries)
		}
	}
	// Each upstream query stored one variant.
	checkShards(t, c.store)
	if n := c.store.Usage().Variants; n != 10 {
		t.Errorf("%d ECS variants stored, want 10", n)
	}
}

func TestECSSourceZeroAndNoECS(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache", g, newClock())
	// Source /0: the answer serves only /0 queries of its family (RFC 7871
	// 7.3.1).
	for i, step := range []struct {
		subnet  string
		queries int
	}{{"0.0.0.0/0", 1}, {"0.0.0.0/0", 1}, {"10.1.1.0/24", 2}, {"::/0", 3}, {"::/0", 3}} {
		ask(t, c, geoQuery("s16.geo.", step.subnet), false)
		if n := g.count("s16.geo."); n != step.queries {
			t.Errorf("step %d, %s: upstream asked %d times, want %d", i, step.subnet, n, step.queries)
		}
	}
	// An answer fetched without ECS has no scope and serves the clients
	// that send none; a client with ECS asks for its own.
	network, echo := geoAnswer(t, ask(t, c, geoQuery("s24.geo.", ""), false))
	if network != "none" || echo != nil {
		t.Fatalf("no ECS: answer for %s with ECS %v", network, echo)
	}
	if network, _ := geoAnswer(t, ask(t, c, geoQuery("s24.geo.", "10.9.9.0/24"), false)); network != "10.9.9.0/24" || g.count("s24.geo.") != 2 {
		t.Fatalf("after an answer without ECS: %s, upstream asked %d times; want the client's own", network, g.count("s24.geo."))
	}
}

func TestECSForgedNotCached(t *testing.T) {
	for _, forge := range []func(e *dns.EDNS0_SUBNET){
		func(e *dns.EDNS0_SUBNET) { e.SourceNetmask = 16 },
		func(e *dns.EDNS0_SUBNET) { e.Address = net.IPv4(10, 9, 9, 0) },
		func(e *dns.EDNS0_SUBNET) { e.Family = dnsmsg.FamilyIPv6; e.Address = net.ParseIP("2001:db8::") },
	} {
		g := newGeoUpstream()
		g.forge = forge
		c := newGeoCache(t, "compactcache", g, newClock())
		// RFC 7871 7.3: the reply is dropped, as Unbound drops it, and the
		// client gets SERVFAIL (docs/ecs.md says why it is not asked again
		// without ECS as Unbound does).
		for range 2 {
			got := ask(t, c, geoQuery("s24.geo.", "10.1.1.0/24"), false)
			echo := dnsmsg.Subnet(got)
			if got.Rcode != dns.RcodeServerFailure || len(got.Answer) != 0 || echo == nil || echo.SourceNetmask != 24 || !echo.Address.Equal(net.IPv4(10, 1, 1, 0)) {
				t.Errorf("forged reply: the client got %s, %d answers, ECS %v; want SERVFAIL and its own 10.1.1.0/24", dns.RcodeToString[got.Rcode], len(got.Answer), echo)
			}
		}
		if n := g.count("s24.geo."); n != 2 || c.Stats().Entries != 0 {
			t.Errorf("forged reply: upstream asked %d times, %d entries; want 2 and none", n, c.Stats().Entries)
		}
	}
}

func TestECSAddAndMaxVariants(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache {\n ecs 16 48 {\n add\n max_variants 2\n }\n}", g, newClock())
	// A client that sends no ECS gets one added from its address, cut to
	// the configured /16, and none echoed back.
	rec := &recorder{ResponseWriter: test.ResponseWriter{}} // 10.240.0.1
	if _, err := c.ServeDNS(context.Background(), rec, geoQuery("s24.geo.", "")); err != nil {
		t.Fatal(err)
	}
	network, echo := geoAnswer(t, rec.msg)
	if network != "10.240.0.0/16" || echo != nil || g.sources[0] != "10.240.0.0/16" {
		t.Fatalf("added ECS: answer for %s, echo %v, upstream saw %v", network, echo, g.sources)
	}
	// Three subnets, two kept: the oldest goes.
	for _, s := range []string{"10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16", "10.2.0.0/16", "10.1.0.0/16"} {
		ask(t, c, geoQuery("s16.geo.", s), false)
	}
	if n := g.count("s16.geo."); n != 4 {
		t.Fatalf("upstream asked %d times, want 4: 10.1 asked again after 10.3 pushed it out", n)
	}
}

func TestECSPrefetchUsesStoredSubnet(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n prefetch 1 1m 50%\n}", g, clk)
	q := geoQuery("s16.geo.", "10.1.2.0/24")
	ask(t, c, q, false)
	clk.advance(200 * time.Second)
	ask(t, c, q, false)
	await(t, "the prefetch", func() bool { return g.count("s16.geo.") == 2 })
	g.mu.Lock()
	defer g.mu.Unlock()
	if got := g.sources[1]; got != "10.1.0.0/16" {
		t.Fatalf("prefetch asked for %s, want the stored subnet 10.1.0.0/16", got)
	}
}

// TestECSNeverServesAnotherNetwork asks random names from random subnets and
// checks every answer against the client: the network it was chosen for
// contains the client, is no longer than the client's source prefix, and is
// exactly what the upstream would answer wherever the upstream's scope fits
// in what the client sent.
func TestECSNeverServesAnotherNetwork(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n capacity 1MiB\n}", g, clk)
	rng := rand.New(rand.NewPCG(7, 11))
	scopes4 := []int{0, 8, 16, 20, 24, 32}
	scopes6 := []int{0, 32, 48, 56, 64}
	for i := range 5000 {
		var client netip.Prefix
		var scope int
		if rng.IntN(4) == 0 {
			a := [16]byte{0x20, 0x01, 0x0d, 0xb8, byte(rng.IntN(4)), byte(rng.IntN(4)), byte(rng.IntN(4)), byte(rng.IntN(256))}
			client = netip.PrefixFrom(netip.AddrFrom16(a), rng.IntN(129))
			scope = scopes6[rng.IntN(len(scopes6))]
		} else {
			a := [4]byte{10, byte(rng.IntN(3)), byte(rng.IntN(3)), byte(rng.IntN(256))}
			client = netip.PrefixFrom(netip.AddrFrom4(a), rng.IntN(33))
			scope = scopes4[rng.IntN(len(scopes4))]
		}
		client = client.Masked()
		name := fmt.Sprintf("s%d.n%d.geo.", scope, rng.IntN(3))
		network, _ := geoAnswer(t, ask(t, c, geoQuery(name, client.String()), false))
		got := netip.MustParsePrefix(network)
		sent := min(client.Bits(), 24)
		if client.Addr().Is6() {
			sent = min(client.Bits(), 56)
		}
		if got.Bits() > sent || !got.Contains(client.Addr()) {
			t.Fatalf("query %d: %s from %s got the answer for %s", i, name, client, got)
		}
		if want, _ := client.Addr().Prefix(min(sent, scope)); scope <= sent && got != want {
			t.Fatalf("query %d: %s from %s got the answer for %s, the upstream's is %s", i, name, client, got, want)
		}
		if i%500 == 0 {
			clk.advance(time.Minute) // let entries age and expire
		}
	}
}

// TestECSListGrowsByDoubling: a name's list of variants takes new variants
// in place and is written again only when it doubles, so k variants cost
// O(k) bytes of arena; past max_variants the oldest makes way.
func TestECSListGrowsByDoubling(t *testing.T) {
	s, err := store.New(store.MinCapacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	base := keyOf(&query{name: []byte("\x03geo\x00"), qtype: dns.TypeA, qclass: dns.ClassINET})
	key := entry.ScopesKey(nil, base, dnsmsg.FamilyIPv4)
	const max = 300
	writes, drops := 0, 0
	for i := range 2 * max {
		v := entry.Variant{Prefix: 24, Addr: [16]byte{10, byte(i >> 8), byte(i)}}
		s.Update(key, 0, func(old entry.Entry) entry.Entry {
			fresh, dropped := entry.ListVariant(b, old, base, dnsmsg.FamilyIPv4, v, max, 0, 300)
			if fresh != nil {
				writes++
			}
			if dropped != nil {
				drops++
			}
			return fresh
		})
	}
	if writes > 8 || drops != max {
		t.Fatalf("%d variants through a list of %d: written %d times, %d dropped; want at most 8 writes and %d drops", 2*max, max, writes, drops, max)
	}
	var count int
	var oldest [16]byte
	var bit24 bool
	s.Get(key, s.Hash(key), func(e entry.Entry) bool {
		l := e.List()
		count, oldest, bit24 = l.Count(), l.Item(0).Addr, entry.HasBit(l.Bits(), 24)
		return true
	})
	if count != max || oldest[1] != max>>8 || oldest[2] != max%256 || !bit24 {
		t.Fatalf("list holds %d variants, the oldest %v", count, oldest[:3])
	}
}

// TestECSServeStale: an expired answer tailored to a subnet is served stale
// to clients of that subnet only, with EDE 3 and the client's ECS echoed,
// and refreshed for the subnet it was stored for.
func TestECSServeStale(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n serve_stale 1h immediate\n}", g, clk)
	ask(t, c, geoQuery("s16.geo.", "10.1.2.0/24"), false)
	clk.advance(400 * time.Second)

	got := ask(t, c, geoQuery("s16.geo.", "10.1.9.0/24"), false)
	network, echo := geoAnswer(t, got)
	if code, _ := ede(got); network != "10.1.0.0/16" || code != edeStaleAnswer || echo == nil || echo.SourceScope != 16 ||
		!echo.Address.Equal(net.IPv4(10, 1, 9, 0)) {
		t.Fatalf("stale for 10.1.9.0/24: answer for %s, EDE %d, ECS %v", network, code, echo)
	}
	await(t, "the refresh", func() bool { return g.count("s16.geo.") == 2 })
	g.mu.Lock()
	refreshed := g.sources[1]
	g.mu.Unlock()
	if refreshed != "10.1.0.0/16" {
		t.Fatalf("refresh asked for %s, want the stored subnet 10.1.0.0/16", refreshed)
	}
	// Another network gets no stale answer of this one: a miss.
	if network, _ := geoAnswer(t, ask(t, c, geoQuery("s16.geo.", "10.2.0.0/24"), false)); network != "10.2.0.0/16" {
		t.Fatalf("10.2.0.0/24 got the answer for %s", network)
	}
}

// TestECSVerifyRefreshesStoredScope: serve_stale's verify mode with a
// timeout refreshes a tailored answer in the background as a prefetch does:
// for the subnet it was stored for, not for the client's longer prefix.
func TestECSVerifyRefreshesStoredScope(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n serve_stale 1h verify 1h\n}", g, clk) // an hour: the fetch ends first
	ask(t, c, geoQuery("s16.geo.", "10.1.2.0/24"), false)
	clk.advance(400 * time.Second)
	got := ask(t, c, geoQuery("s16.geo.", "10.1.9.0/24"), false)
	g.mu.Lock()
	sources := g.sources
	g.mu.Unlock()
	network, echo := geoAnswer(t, got)
	if len(sources) != 2 || sources[1] != "10.1.0.0/16" || network != "10.1.0.0/16" || echo == nil || echo.SourceScope != 16 {
		t.Fatalf("upstream asked for %v, answer for %s, ECS %v; want the refresh asked for the stored 10.1.0.0/16", sources, network, echo)
	}
}

// TestECSVerifyRefreshNotStored: a verify refresh asked for the stale
// entry's scope, not the client's subnet, that refreshes without being
// stored (too large for an entry) is not the client's to have: its ECS
// echoes another source. The stale entry serves, not SERVFAIL.
func TestECSVerifyRefreshNotStored(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n serve_stale 1h verify 1h\n}", g, clk) // an hour: the fetch ends first
	ask(t, c, geoQuery("s16.geo.", "10.1.2.0/24"), false)
	c.MaxEntry = 1 // the refresh's reply is too large to store
	clk.advance(400 * time.Second)
	got := ask(t, c, geoQuery("s16.geo.", "10.1.9.0/24"), false)
	network, echo := geoAnswer(t, got)
	if network != "10.1.0.0/16" || echo == nil || echo.SourceNetmask != 24 || echo.SourceScope != 16 {
		t.Fatalf("answer for %s, ECS %v; want the stale 10.1.0.0/16 with the client's source /24", network, echo)
	}
}

// TestECSMaxVariantsDropsKeptDenial: under serve_stale_policy prefer_positive
// a subnet's denial is kept beside its answer (KeyOther); when max_variants
// pushes the subnet out of the name's list, both go. A denial left behind
// is listed nowhere: it outlives max_variants, a flush of the name misses
// it, and once another subnet lists the prefix length again it is served.
func TestECSMaxVariantsDropsKeptDenial(t *testing.T) {
	asked := map[string]int{}
	next := test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		e := dnsmsg.Subnet(r)
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		network := net.IP(e.Address).String()
		asked[network]++
		if network == "10.1.1.0" {
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{test.SOA("geo. 300 IN SOA ns.geo. host.geo. 1 3600 600 86400 300")}
		} else {
			m.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300}, Txt: []string{network}}}
		}
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: e.Family, SourceNetmask: e.SourceNetmask, SourceScope: 24, Address: e.Address}}
		return dns.RcodeSuccess, w.WriteMsg(m)
	})
	c := mustParse(t, "compactcache {\n serve_stale\n serve_stale_policy prefer_positive\n ecs {\n max_variants 1\n }\n}")
	c.Next, c.now = next, newClock().now
	t.Cleanup(func() { c.refreshes.shutdown(time.Second) })

	if got := ask(t, c, geoQuery("s24.geo.", "10.1.1.0/24"), false); got.Rcode != dns.RcodeNameError {
		t.Fatalf("10.1.1.0/24: rcode %s, want NXDOMAIN", dns.RcodeToString[got.Rcode])
	}
	ask(t, c, geoQuery("s24.geo.", "10.2.2.0/24"), false) // pushes 10.1.1.0/24 out of the list
	if n := c.store.Usage().Variants; n != 1 {
		t.Errorf("%d ECS variants stored with max_variants 1", n)
	}
	c.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "s24.geo.")}})
	ask(t, c, geoQuery("s24.geo.", "10.3.3.0/24"), false) // lists /24 again
	ask(t, c, geoQuery("s24.geo.", "10.1.1.0/24"), false)
	if asked["10.1.1.0"] != 2 {
		t.Errorf("10.1.1.0/24 asked upstream %d times across a flush of the name, want 2: its denial outlived the flush", asked["10.1.1.0"])
	}
}

// TestAnswerDropsDenialBeside: under serve_stale_policy prefer_positive a
// denial the upstream sent for a name is kept beside its stale answer; the
// answer that comes back replaces both, as the stock cache removes the
// denial, an ECS variant's as the name's. A denial left beside would be
// served stale once the answer left the window, for a name that exists.
func TestAnswerDropsDenialBeside(t *testing.T) {
	for _, subnet := range []string{"", "10.1.1.0/24"} {
		t.Run("ECS "+subnet, func(t *testing.T) {
			rcode := dns.RcodeSuccess
			next := test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
				m := new(dns.Msg)
				m.SetRcode(r, rcode)
				switch rcode {
				case dns.RcodeSuccess:
					m.Answer = []dns.RR{test.TXT("s24.geo. 60 IN TXT answer")}
				case dns.RcodeNameError:
					m.Ns = []dns.RR{test.SOA("geo. 1800 IN SOA ns.geo. host.geo. 1 3600 600 86400 1800")}
				}
				m.SetEdns0(1232, false)
				if e := dnsmsg.Subnet(r); e != nil {
					m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: e.Family, SourceNetmask: e.SourceNetmask, SourceScope: 24, Address: e.Address}}
				}
				return dns.RcodeSuccess, w.WriteMsg(m)
			})
			clk := newClock()
			c := mustParse(t, "compactcache {\n serve_stale 1h verify\n serve_stale_policy prefer_positive\n servfail 0\n}")
			c.Next, c.now = next, clk.now
			t.Cleanup(func() { c.refreshes.shutdown(time.Second) })
			// The answer, then a denial kept beside it, then the answer again.
			for _, rcode = range []int{dns.RcodeSuccess, dns.RcodeNameError, dns.RcodeSuccess} {
				ask(t, c, geoQuery("s24.geo.", subnet), false)
				clk.advance(100 * time.Second)
			}
			// The upstream is down once the answer is past the window, and
			// the denial it replaced would not be.
			rcode = dns.RcodeServerFailure
			clk.advance(time.Hour)
			if got := ask(t, c, geoQuery("s24.geo.", subnet), false); got.Rcode != dns.RcodeServerFailure {
				t.Errorf("%s, want SERVFAIL: the denial the answer replaced was served", dns.RcodeToString[got.Rcode])
			}
		})
	}
}

// TestECSVariantCachedAgainAfterExpiry: an answer tailored to a subnet and
// fetched again once expired is cached again: the name's list of variants
// lives as long as the variants it lists, the one fetched again too.
func TestECSVariantCachedAgainAfterExpiry(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache", g, clk)
	q := geoQuery("s24.geo.", "10.1.1.0/24")
	ask(t, c, q, false)
	clk.advance(301 * time.Second) // past the answer's TTL of 300
	for range 3 {
		if network, _ := geoAnswer(t, ask(t, c, q, false)); network != "10.1.1.0/24" {
			t.Fatalf("answer for %s", network)
		}
	}
	if n := g.count("s24.geo."); n != 2 {
		t.Errorf("upstream asked %d times, want 2: the answer fetched again after it expired was not served from the cache", n)
	}
}

// TestECSFlushAfterListEvicted: a name's list of ECS variants can leave the
// store before the variants it listed (main's CLOCK passes the list's older
// chunk first). A flush of the name finds its variants through the list, so
// the variants the list no longer lists must not be served after it either,
// when a later variant lists their prefix length again.
func TestECSFlushAfterListEvicted(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache", g, clk)
	ask(t, c, geoQuery("s24.geo.", "10.1.1.0/24"), false)
	clk.advance(10 * time.Second)
	base, _ := entry.KeyFor("s24.geo.", dns.TypeTXT, dns.ClassINET, false)
	c.store.Remove(entry.ScopesKey(nil, base, dnsmsg.FamilyIPv4)) // as an eviction would
	c.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "s24.geo.")}})
	ask(t, c, geoQuery("s24.geo.", "10.2.2.0/24"), false) // lists /24 again
	ask(t, c, geoQuery("s24.geo.", "10.1.1.0/24"), false)
	if n := g.count("s24.geo."); n != 3 {
		t.Errorf("upstream asked %d times, want 3: 10.1.1.0/24 was served its answer from before the flush", n)
	}
}

// noAddrWriter is a client without an IP address (as a DoH or in-process
// client may present itself): `ecs { add }` has no subnet to add for it.
type noAddrWriter struct{ *recorder }

func (noAddrWriter) RemoteAddr() net.Addr { return &net.UnixAddr{Name: "@client", Net: "unix"} }

// TestECSAddRefreshWithoutAddress: under `ecs { add }` an answer fetched
// without ECS, for a client with no address, is refreshed as it was fetched,
// without ECS; not as the background fetch's own address, ::1, whose /56
// would store a variant and leave the entry to expire.
func TestECSAddRefreshWithoutAddress(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n prefetch 1 1m 50%\n ecs {\n add\n }\n}", g, clk)
	askNoAddr := func() *dns.Msg {
		rec := &recorder{ResponseWriter: test.ResponseWriter{}}
		if _, err := c.ServeDNS(context.Background(), noAddrWriter{rec}, geoQuery("s16.geo.", "")); err != nil {
			t.Fatal(err)
		}
		return rec.msg
	}
	if network, _ := geoAnswer(t, askNoAddr()); network != "none" {
		t.Fatalf("answer for %s, want none: no ECS to add", network)
	}
	clk.advance(200 * time.Second)
	askNoAddr()
	await(t, "the prefetch", func() bool {
		c.refreshes.mu.Lock()
		defer c.refreshes.mu.Unlock()
		return g.count("s16.geo.") == 2 && len(c.refreshes.inflight) == 0
	})
	g.mu.Lock()
	sources := g.sources
	g.mu.Unlock()
	if len(sources) != 0 || c.store.Usage().Variants != 0 {
		t.Fatalf("refresh sent ECS %v and stored %d variants; want none", sources, c.store.Usage().Variants)
	}
	clk.advance(120 * time.Second) // past the first fetch's TTL, short of the refresh's prefetch
	if network, _ := geoAnswer(t, askNoAddr()); network != "none" || g.count("s16.geo.") != 2 {
		t.Fatalf("after the refresh: answer for %s, upstream asked %d times; want the refreshed entry", network, g.count("s16.geo."))
	}
}

// TestECSSourceZeroTakesScopeZero: an answer with scope /0 is good for every
// address of its family, so a query with source /0 of that family takes it
// (as Unbound's tree answers source /0 from its root) rather than asking.
func TestECSSourceZeroTakesScopeZero(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache", g, newClock())
	ask(t, c, geoQuery("s0.geo.", "10.1.1.0/24"), false)
	network, echo := geoAnswer(t, ask(t, c, geoQuery("s0.geo.", "0.0.0.0/0"), false))
	if network != "0.0.0.0/0" || echo == nil || echo.SourceNetmask != 0 || echo.SourceScope != 0 || g.count("s0.geo.") != 1 {
		t.Fatalf("source /0 after a scope /0 answer: answer for %s, ECS %v, upstream asked %d times; want the scope /0 answer from the cache", network, echo, g.count("s0.geo."))
	}
}

// TestECSMalformedFormErr: a query whose ECS option RFC 7871 6 calls
// malformed (an unknown family, a source prefix longer than the family's
// addresses, address bits past the source prefix) is answered FORMERR, as
// Unbound answers it (RFC 7871 7.1.1), not passed upstream as it came.
func TestECSMalformedFormErr(t *testing.T) {
	for _, e := range []*dns.EDNS0_SUBNET{
		{Code: dns.EDNS0SUBNET, Family: dnsmsg.FamilyIPv4, SourceNetmask: 24, Address: net.IPv4(10, 1, 1, 5).To4()},
		{Code: dns.EDNS0SUBNET, Family: dnsmsg.FamilyIPv4, SourceNetmask: 33, Address: net.IPv4(10, 1, 1, 5).To4()},
		{Code: dns.EDNS0SUBNET, Family: 3, SourceNetmask: 8, Address: net.IPv4(10, 0, 0, 0).To4()},
	} {
		g := newGeoUpstream()
		c := newGeoCache(t, "compactcache", g, newClock())
		q := geoQuery("s24.geo.", "")
		q.IsEdns0().Option = []dns.EDNS0{e}
		if got := ask(t, c, q, false); got.Rcode != dns.RcodeFormatError || g.count("s24.geo.") != 0 {
			t.Errorf("ECS %v: rcode %s, upstream asked %d times; want FORMERR and none", e, dns.RcodeToString[got.Rcode], g.count("s24.geo."))
		}
	}
}

// TestECSSourceZeroRefreshesNoECS: a query with source /0 may take an answer
// fetched without ECS; its prefetch refreshes that answer as it was fetched,
// without ECS, rather than fetch a /0 answer beside it and let the answer
// the clients without ECS take expire.
func TestECSSourceZeroRefreshesNoECS(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache {\n prefetch 1 1m 50%\n}", g, clk)
	ask(t, c, geoQuery("s16.geo.", ""), false)
	clk.advance(200 * time.Second)
	ask(t, c, geoQuery("s16.geo.", "0.0.0.0/0"), false)
	await(t, "the prefetch", func() bool {
		c.refreshes.mu.Lock()
		defer c.refreshes.mu.Unlock()
		return g.count("s16.geo.") == 2 && len(c.refreshes.inflight) == 0
	})
	clk.advance(120 * time.Second) // past the first fetch's TTL, short of the refresh's prefetch
	if network, _ := geoAnswer(t, ask(t, c, geoQuery("s16.geo.", ""), false)); network != "none" || g.count("s16.geo.") != 2 {
		t.Fatalf("after the refresh: answer for %s, upstream asked %d times, ECS sent %v; want the refreshed entry", network, g.count("s16.geo."), g.sources)
	}
}

// TestECSEchoScopeBeyondSource: an answer whose upstream wanted more bits
// than the client sent (scope /16 to a /8) serves only queries that send /8
// (RFC 7871 7.3.1), and its echo says so with a scope longer than the
// client's source, as Unbound echoes the upstream's; echoed as /8 it would
// tell the client's own cache that it serves every query of the /8.
func TestECSEchoScopeBeyondSource(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache", g, newClock())
	for range 2 { // the miss and the hit
		_, echo := geoAnswer(t, ask(t, c, geoQuery("s16.geo.", "10.0.0.0/8"), false))
		if echo == nil || echo.SourceNetmask != 8 || echo.SourceScope <= 8 {
			t.Fatalf("scope /16 to a /8 query: ECS %v echoed, want a scope longer than /8", echo)
		}
	}
}

// TestECSSourceZeroVerifiesNoECS: serve_stale's verify mode refreshes an
// answer fetched without ECS that a query with source /0 finds stale as it
// was fetched, without ECS, whether it waits for the refresh or not.
func TestECSSourceZeroVerifiesNoECS(t *testing.T) {
	for _, verify := range []string{"verify", "verify 5s"} {
		t.Run(verify, func(t *testing.T) {
			g := newGeoUpstream()
			clk := newClock()
			c := newGeoCache(t, "compactcache {\n serve_stale 1h "+verify+"\n}", g, clk)
			ask(t, c, geoQuery("s16.geo.", ""), false)
			clk.advance(400 * time.Second)
			network, echo := geoAnswer(t, ask(t, c, geoQuery("s16.geo.", "0.0.0.0/0"), false))
			if network != "none" || echo == nil || echo.SourceNetmask != 0 || g.count("s16.geo.") != 2 {
				t.Fatalf("verified for /0: answer for %s, ECS %v, upstream asked %d times (ECS sent %v); want the answer refreshed without ECS", network, echo, g.count("s16.geo."), g.sources)
			}
			got := ask(t, c, geoQuery("s16.geo.", ""), false)
			if network, _ := geoAnswer(t, got); network != "none" || g.count("s16.geo.") != 2 {
				t.Fatalf("no ECS after the verify: answer for %s, upstream asked %d times; want the refreshed entry", network, g.count("s16.geo."))
			}
			if code, _ := ede(got); code == edeStaleAnswer {
				t.Fatal("no ECS after the verify: served stale, want the refreshed entry")
			}
		})
	}
}
