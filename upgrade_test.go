package compactcache

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/adminserver"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/persist"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// The tests of entries stored without their DNSSEC records for clients
// without DO, and upgraded when a DO client asks.

// signedUpstream answers as a signing upstream does, whatever the query's
// DO (the cache always asks with DO=1): a signed answer, NXDOMAIN and
// NODATA with their NSEC proofs, a compact denial (RFC 9824), and an
// unsigned answer.
func signedUpstream(t *testing.T) *upstream {
	u := newUpstream()
	soa := mustRR(t, "example. 300 IN SOA ns.example. host.example. 1 7200 3600 1209600 300")
	soaSig := mustRR(t, "example. 300 IN RRSIG SOA 13 1 300 20300101000000 20200101000000 12345 example. AAAA")
	sig := func(owner, covered string) dns.RR {
		return mustRR(t, owner+" 300 IN RRSIG "+covered+" 13 2 300 20300101000000 20200101000000 12345 example. AAAA")
	}
	u.add("s.example.", dns.TypeA, dns.RcodeSuccess, []dns.RR{mustRR(t, "s.example. 300 IN A 192.0.2.1"), sig("s.example.", "A")}, nil, nil)
	u.add("nx.example.", dns.TypeA, dns.RcodeNameError, nil, []dns.RR{
		soa, soaSig, mustRR(t, "m.example. 300 IN NSEC o.example. A RRSIG NSEC"), sig("m.example.", "NSEC"),
	}, nil)
	u.add("s.example.", dns.TypeMX, dns.RcodeSuccess, nil, []dns.RR{
		soa, soaSig, mustRR(t, "s.example. 300 IN NSEC t.example. A RRSIG NSEC"), sig("s.example.", "NSEC"),
	}, nil)
	u.add("gone.example.", dns.TypeA, dns.RcodeSuccess, nil, []dns.RR{
		soa, soaSig, mustRR(t, "gone.example. 300 IN NSEC \\000.gone.example. RRSIG NSEC NXNAME"), sig("gone.example.", "NSEC"),
	}, nil)
	u.add("plain.example.", dns.TypeA, dns.RcodeSuccess, []dns.RR{mustRR(t, "plain.example. 300 IN A 192.0.2.2")}, nil, nil)
	return u
}

// signedCases are signedUpstream's questions, the rcode a client without DO
// gets, and whether the reply holds records only DO clients get.
var signedCases = []struct {
	name   string
	qtype  uint16
	rcode  int
	signed bool
}{
	{"s.example.", dns.TypeA, dns.RcodeSuccess, true},
	{"nx.example.", dns.TypeA, dns.RcodeNameError, true},
	{"s.example.", dns.TypeMX, dns.RcodeSuccess, true},     // NODATA
	{"gone.example.", dns.TypeA, dns.RcodeNameError, true}, // compact denial, restored
	{"plain.example.", dns.TypeA, dns.RcodeSuccess, false},
}

// query returns a request for name/qtype with EDNS and the DO bit do.
func doQuery(name string, qtype uint16, do bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(1232, do)
	return m
}

// storedEntry returns a copy of the entry c holds for name/qtype (CD clear),
// or nil.
func storedEntry(t *testing.T, c *Cache, name string, qtype uint16) entry.Entry {
	t.Helper()
	var wire [dnsmsg.MaxNameLen]byte
	n, err := dnsmsg.PackName(name, wire[:])
	if err != nil {
		t.Fatal(err)
	}
	key := entry.AppendKey(nil, wire[:n], qtype, dns.ClassINET, false)
	var got entry.Entry
	c.store.Get(key, c.store.Hash(key), func(e entry.Entry) bool {
		got = append(entry.Entry(nil), e...)
		return true
	})
	return got
}

// dnssecRecords counts the records of e that only DO clients get.
func dnssecRecords(e entry.Entry) int {
	n := 0
	var counts [3]int
	off := e.Records(&counts)
	var r entry.Record
	for _, c := range counts {
		for range c {
			off = e.Record(off, &r)
			if r.Flags&entry.RecDNSSEC != 0 {
				n++
			}
		}
	}
	return n
}

// TestNonDOMissStoresNoDNSSEC: a miss for a client without DO stores the
// reply without its RRSIG, NSEC and NSEC3 records, in fewer bytes than the
// entry a DO client's miss stores, and serves clients without DO as that
// entry does: answers, NXDOMAIN, NODATA and a compact denial's NXDOMAIN
// alike. A reply without such records is stored whole and serves DO
// clients at once.
func TestNonDOMissStoresNoDNSSEC(t *testing.T) {
	for _, tc := range signedCases {
		t.Run(tc.name+dns.TypeToString[tc.qtype], func(t *testing.T) {
			u := signedUpstream(t)
			clk := newClock()
			plain, full := newTestCache(t, u, clk), newTestCache(t, u, clk)
			got := ask(t, plain, doQuery(tc.name, tc.qtype, false), false)
			ask(t, full, doQuery(tc.name, tc.qtype, true), false)
			if got.Rcode != tc.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[got.Rcode], dns.RcodeToString[tc.rcode])
			}
			stripped, whole := storedEntry(t, plain, tc.name, tc.qtype), storedEntry(t, full, tc.name, tc.qtype)
			if stripped == nil || whole == nil {
				t.Fatalf("stored: without DO %v, with DO %v; want both", stripped != nil, whole != nil)
			}
			if n := dnssecRecords(stripped); n != 0 {
				t.Errorf("the entry stored for a client without DO holds %d DNSSEC records", n)
			}
			if stripped.HoldsDNSSEC() != !tc.signed || !whole.HoldsDNSSEC() {
				t.Errorf("HoldsDNSSEC: %v stored without DO, %v with DO; want %v and true", stripped.HoldsDNSSEC(), whole.HoldsDNSSEC(), !tc.signed)
			}
			if d := adminserver.Describe(stripped, clk.now().Unix(), 0); d.NoDNSSEC != tc.signed {
				t.Errorf("the admin lookup says no-dnssec %v, want %v", d.NoDNSSEC, tc.signed)
			}
			if tc.signed && stripped.Size() >= whole.Size() || !tc.signed && stripped.Size() != whole.Size() {
				t.Errorf("entry of %d bytes without DO, %d with DO", stripped.Size(), whole.Size())
			}
			// Hits of clients without DO, with EDNS or without, are the same
			// from either entry.
			for _, req := range []*dns.Msg{doQuery(tc.name, tc.qtype, false), test.Case{Qname: tc.name, Qtype: tc.qtype}.Msg()} {
				a, b := ask(t, plain, req, false), ask(t, full, req.Copy(), false)
				if a.String() != b.String() {
					t.Errorf("a client without DO gets from the entry stored without DO\n%s\nand from the one stored with DO\n%s", a, b)
				}
			}
			if n := u.count(tc.name, tc.qtype); n != 2 {
				t.Errorf("%d upstream queries, want 2: one miss per cache", n)
			}
		})
	}
}

// TestDOUpgrade: a DO client that finds an entry stored without DNSSEC
// records misses once, and its fetch replaces the entry with one that holds
// them; then DO and non-DO clients hit that one entry, and get what they
// would from an entry a DO client filled.
func TestDOUpgrade(t *testing.T) {
	for _, tc := range signedCases {
		t.Run(tc.name+dns.TypeToString[tc.qtype], func(t *testing.T) {
			u := signedUpstream(t)
			clk := newClock()
			c, ref := newTestCache(t, u, clk), newTestCache(t, u, clk)
			ask(t, c, doQuery(tc.name, tc.qtype, false), false)
			ask(t, ref, doQuery(tc.name, tc.qtype, true), false)
			asked := u.count(tc.name, tc.qtype)
			got := ask(t, c, doQuery(tc.name, tc.qtype, true), false)
			want := 0
			if tc.signed {
				want = 1
			}
			if n := u.count(tc.name, tc.qtype) - asked; n != want {
				t.Fatalf("the first DO client made %d upstream queries, want %d", n, want)
			}
			if !hasType(got, dns.TypeRRSIG) != !tc.signed {
				t.Errorf("the first DO client's reply has RRSIG: %v, want %v\n%s", hasType(got, dns.TypeRRSIG), tc.signed, got)
			}
			if e := storedEntry(t, c, tc.name, tc.qtype); e == nil || !e.HoldsDNSSEC() {
				t.Fatal("after the DO client's miss the entry does not hold its DNSSEC records")
			}
			asked = u.count(tc.name, tc.qtype)
			for _, do := range []bool{true, false, true, false} {
				req := doQuery(tc.name, tc.qtype, do)
				a, b := ask(t, c, req, false), ask(t, ref, req, false)
				if a.String() != b.String() {
					t.Errorf("DO=%v: the upgraded entry gives\n%s\nthe entry a DO client filled\n%s", do, a, b)
				}
			}
			if n := u.count(tc.name, tc.qtype) - asked; n != 0 {
				t.Errorf("%d upstream queries after the upgrade, want 0", n)
			}
			if n := c.Stats().Entries; n != 1 {
				t.Errorf("%d entries, want the one", n)
			}
		})
	}
}

func hasType(m *dns.Msg, t uint16) bool {
	for _, rrs := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range rrs {
			if rr.Header().Rrtype == t {
				return true
			}
		}
	}
	return false
}

// TestFailedUpgradeKeepsEntry: when the DO client's fetch fails, the entry
// stored without DNSSEC records goes on serving clients without DO, and no
// SERVFAIL is cached in its place.
func TestFailedUpgradeKeepsEntry(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(u *upstream)
	}{
		{"SERVFAIL", func(u *upstream) { u.add("s.example.", dns.TypeA, dns.RcodeServerFailure, nil, nil, nil) }},
		{"no reply", func(u *upstream) { u.set("s.example.", dns.TypeA, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := signedUpstream(t)
			c := newTestCache(t, u, newClock())
			ask(t, c, doQuery("s.example.", dns.TypeA, false), false)
			tc.fail(u)
			rec := &recorder{}
			c.ServeDNS(context.Background(), rec, doQuery("s.example.", dns.TypeA, true))
			if rec.msg != nil && rec.msg.Rcode != dns.RcodeServerFailure {
				t.Errorf("the DO client got %s, want SERVFAIL", dns.RcodeToString[rec.msg.Rcode])
			}
			asked := u.count("s.example.", dns.TypeA)
			got := ask(t, c, doQuery("s.example.", dns.TypeA, false), false)
			if got.Rcode != dns.RcodeSuccess || len(got.Answer) != 1 {
				t.Errorf("a client without DO after the failed upgrade: %v", got)
			}
			if n := u.count("s.example.", dns.TypeA) - asked; n != 0 {
				t.Errorf("a client without DO after the failed upgrade made %d upstream queries, want 0", n)
			}
		})
	}
}

// TestUpgradeBeforeDenialBeside: under serve_stale_policy prefer_positive,
// a DO client that finds an answer kept without its DNSSEC records misses
// and upgrades it, rather than take the denial kept beside it.
func TestUpgradeBeforeDenialBeside(t *testing.T) {
	u := signedUpstream(t)
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h verify\n serve_stale_policy prefer_positive\n}", u, clk)
	answer := u.script("s.example.", dns.TypeA)
	ask(t, c, doQuery("s.example.", dns.TypeA, false), false)
	// The name is gone upstream for a while: a client without DO keeps
	// getting the stale answer, and the denial is kept beside it.
	u.add("s.example.", dns.TypeA, dns.RcodeNameError, nil, []dns.RR{mustRR(t, "example. 300 IN SOA ns.example. host.example. 1 7200 3600 1209600 300")}, nil)
	clk.advance(400 * time.Second)
	if got := ask(t, c, doQuery("s.example.", dns.TypeA, false), false); got.Rcode != dns.RcodeSuccess {
		t.Fatalf("a client without DO: %s, want the stale answer", dns.RcodeToString[got.Rcode])
	}
	if n := c.Stats().Entries; n != 2 {
		t.Fatalf("%d entries, want the answer and the denial beside it", n)
	}
	// It is back: the DO client gets it, with its signature.
	u.set("s.example.", dns.TypeA, answer)
	if got := ask(t, c, doQuery("s.example.", dns.TypeA, true), false); got.Rcode != dns.RcodeSuccess || len(got.Answer) != 2 {
		t.Errorf("the DO client got %v, want the answer and its RRSIG", got)
	}
}

// TestConcurrentMissesDOApart: misses for one name from clients without DO
// and with DO, while the upstream is held: those without DO share the
// first fetch, the DO clients one of their own, since the first stores no
// signatures; each client gets what it asked for, and the entry the DO
// fetch stores serves both kinds after, whichever fetch lands first: the
// entry without signatures, landing last, does not replace it.
func TestConcurrentMissesDOApart(t *testing.T) {
	for _, doFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("DO fetch lands first %v", doFirst), func(t *testing.T) { testConcurrentMissesDOApart(t, doFirst) })
	}
}

func testConcurrentMissesDOApart(t *testing.T, doFirst bool) {
	u := signedUpstream(t)
	c := newTestCache(t, u, newClock())
	var (
		mu      sync.Mutex
		fetches []chan struct{}
	)
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		hold := make(chan struct{})
		mu.Lock()
		fetches = append(fetches, hold)
		n := len(fetches)
		mu.Unlock()
		if n <= 2 { // the two the test lands in turn; any later one is counted
			<-hold
		}
		return u.ServeDNS(ctx, w, r)
	})
	held := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(fetches)
	}
	var wg sync.WaitGroup
	client := func(do bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := &recorder{}
			if _, err := c.ServeDNS(context.Background(), rec, doQuery("s.example.", dns.TypeA, do)); err != nil || rec.msg == nil {
				t.Errorf("DO=%v: %v, reply %v", do, err, rec.msg)
				return
			}
			if len(rec.msg.Answer) == 0 || hasType(rec.msg, dns.TypeRRSIG) != do {
				t.Errorf("DO=%v: the reply has RRSIG: %v\n%s", do, hasType(rec.msg, dns.TypeRRSIG), rec.msg)
			}
		}()
	}
	client(false)
	await(t, "the first fetch", func() bool { return held() == 1 })
	client(true)
	await(t, "the DO client's fetch", func() bool { return held() == 2 })
	for i := range 20 {
		client(i%2 == 0)
	}
	await(t, "the clients to join the flights", func() bool {
		flights, joined := c.flights.Waiting()
		return flights == 2 && joined == 20
	})
	first, second := 0, 1 // fetches[0] is without DO
	if doFirst {
		first, second = 1, 0
	}
	mu.Lock()
	close(fetches[first])
	mu.Unlock()
	await(t, "the first fetch to land", func() bool { return c.flights.InFlight() == 1 })
	mu.Lock()
	close(fetches[second])
	mu.Unlock()
	wg.Wait()
	if n := u.count("s.example.", dns.TypeA); n != 2 {
		t.Fatalf("%d upstream queries, want 2: one for each kind of client", n)
	}
	for _, do := range []bool{true, false} {
		ask(t, c, doQuery("s.example.", dns.TypeA, do), false)
	}
	if n := held(); n != 2 {
		t.Errorf("%d fetches, want 2: the entry the DO fetch stored serves both kinds", n)
	}
}

// TestRefreshKeepsDNSSEC: a refresh that a client without DO sets off
// (serve_stale, prefetch) keeps the DNSSEC records of the entry it
// refreshes, so that DO clients still hit it.
func TestRefreshKeepsDNSSEC(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config func(c *Cache)
		wait   time.Duration
	}{
		{"serve_stale", func(c *Cache) { c.StaleUpTo = time.Hour }, 301 * time.Second},
		{"prefetch", func(c *Cache) { c.Prefetch = 1 }, 280 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := signedUpstream(t)
			clk := newClock()
			c := newTestCache(t, u, clk)
			tc.config(c)
			if err := c.init(); err != nil {
				t.Fatal(err)
			}
			ask(t, c, doQuery("s.example.", dns.TypeA, true), false)
			clk.advance(tc.wait)
			ask(t, c, doQuery("s.example.", dns.TypeA, false), false)
			await(t, "the refresh", func() bool { return u.count("s.example.", dns.TypeA) == 2 && !c.refreshes.running() })
			if e := storedEntry(t, c, "s.example.", dns.TypeA); e == nil || !e.HoldsDNSSEC() || int64(e.Stored()) != clk.now().Unix() {
				t.Fatalf("the refreshed entry is missing, not refreshed, or without its DNSSEC records")
			}
			if got := ask(t, c, doQuery("s.example.", dns.TypeA, true), false); !hasType(got, dns.TypeRRSIG) {
				t.Errorf("a DO client after the refresh: no RRSIG\n%s", got)
			}
			if n := u.count("s.example.", dns.TypeA); n != 2 {
				t.Errorf("%d upstream queries, want 2: the DO client hits the refreshed entry", n)
			}
		})
	}
}

// TestFrontendHandsDOToChainForUpgrade: the front end answers a client
// without DO from an entry stored without DNSSEC records, and hands a DO
// client's query for it to the chain, whose miss upgrades the entry; after
// that the front end answers DO clients too.
func TestFrontendHandsDOToChainForUpgrade(t *testing.T) {
	u := signedUpstream(t)
	c := newTestCache(t, u, newClock())
	ask(t, c, doQuery("s.example.", dns.TypeA, false), false)
	a := frontCache{c}.Answerer("test")
	pack := func(do bool) []byte {
		b, err := doQuery("s.example.", dns.TypeA, do).Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var hit frontend.Hit
	client := netip.MustParseAddr("127.0.0.1")
	if a.Answer(pack(false), client, false, c.now(), &hit) == nil {
		t.Error("the front end hands a query without DO to the chain")
	}
	if a.Answer(pack(true), client, false, c.now(), &hit) != nil {
		t.Fatal("the front end answers a DO query from an entry without its DNSSEC records")
	}
	ask(t, c, doQuery("s.example.", dns.TypeA, true), false) // the chain's miss
	reply := a.Answer(pack(true), client, false, c.now(), &hit)
	if reply == nil {
		t.Fatal("the front end hands a DO query for the upgraded entry to the chain")
	}
	got := new(dns.Msg)
	if err := got.Unpack(reply); err != nil || !hasType(got, dns.TypeRRSIG) {
		t.Errorf("the front end's DO reply: %v, no RRSIG\n%s", err, got)
	}
	if n := u.count("s.example.", dns.TypeA); n != 2 {
		t.Errorf("%d upstream queries, want 2", n)
	}
}

// TestSnapshotKeepsDNSSECFlag: entries read back from a snapshot hold
// their DNSSEC records, or not, as they did when written.
func TestSnapshotKeepsDNSSECFlag(t *testing.T) {
	u := signedUpstream(t)
	clk := newClock()
	c := newTestCache(t, u, clk)
	ask(t, c, doQuery("s.example.", dns.TypeA, false), false)
	ask(t, c, doQuery("nx.example.", dns.TypeA, true), false)
	path := filepath.Join(t.TempDir(), "cache.snap")
	if _, err := persist.WriteFile(operator{c}, path, c.store.Paced(0)); err != nil {
		t.Fatal(err)
	}
	loaded := newTestCache(t, u, clk)
	persist.Load(operator{loaded}, path)
	for _, tc := range []struct {
		name   string
		dnssec bool
	}{{"s.example.", false}, {"nx.example.", true}} {
		e := storedEntry(t, loaded, tc.name, dns.TypeA)
		if e == nil || e.HoldsDNSSEC() != tc.dnssec {
			t.Errorf("%s after the snapshot: stored %v, HoldsDNSSEC %v; want %v", tc.name, e != nil, e != nil && e.HoldsDNSSEC(), tc.dnssec)
		}
	}
}
