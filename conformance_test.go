package compactcache

// Divergences from the stock cache and Unbound that outside test suites
// found (ISC's EDNS compliance tester, CoreDNS's own integration tests, a
// black-box probe), one test each, asserting what the client receives.

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// tsigUpstream answers as an authoritative server that knows no TSIG key:
// FORMERR to a request whose TSIG is not its last record (RFC 8945 5.1),
// NOTAUTH to any other TSIG (BADKEY), and an A record otherwise.
func tsigUpstream(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	for i, rr := range r.Extra {
		if rr.Header().Rrtype != dns.TypeTSIG {
			continue
		}
		m.Rcode = dns.RcodeNotAuth
		if i != len(r.Extra)-1 {
			m.Rcode = dns.RcodeFormatError
		}
		w.WriteMsg(m)
		return
	}
	m.Authoritative = true
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600}, A: net.IPv4(192, 0, 2, 1)}}
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
	}
	w.WriteMsg(m)
}

// signedQuery packs a query for name/A signed with a key the server does
// not know, as `dig -y` sends it: the TSIG record last, no OPT.
func signedQuery(t *testing.T, name string, id uint16) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	m.RecursionDesired = false
	m.SetTsig("client-key.", dns.HmacSHA256, 300, time.Now().Unix())
	b, _, err := dns.TsigGenerate(m, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "", false)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSignedRequestGoesUpstreamWellFormed sends a query signed with a key
// nobody knows through compactcache and a real forward. The client's TSIG
// cannot be kept upstream (its MAC covers the message the cache changes), so
// it is dropped: the upstream gets a well-formed query, and the client gets
// the same answer on the miss and on the hit.
func TestSignedRequestGoesUpstreamWellFormed(t *testing.T) {
	pc, ln := listenUDPTCP(t)
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: dns.HandlerFunc(tsigUpstream)}, {Listener: ln, Handler: dns.HandlerFunc(tsigUpstream)}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		t.Cleanup(func() { s.Shutdown() })
	}
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			udp, _ := mode.start(t, pc.LocalAddr().String())
			var first *dns.Msg
			for i, what := range []string{"miss", "hit"} {
				r, _ := exchangeWire(t, udp, signedQuery(t, "signed.example.", uint16(100+i)))
				if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
					t.Fatalf("%s: rcode %s, %d answers; want NOERROR with the A record\n%v", what, dns.RcodeToString[r.Rcode], len(r.Answer), r)
				}
				if r.IsTsig() != nil || r.IsEdns0() != nil {
					t.Errorf("%s: reply carries TSIG or OPT the unsigned, non-EDNS client did not get from the upstream\n%v", what, r)
				}
				r.Id = 0
				if first == nil {
					first = r
				} else if first.String() != r.String() {
					t.Errorf("the hit differs from the miss:\n%v\nwant\n%v", r, first)
				}
			}
		})
	}
}

// TestSOAMinimumOnlyBoundsDenials asks for a zone's SOA, whose MINIMUM is
// lower than its TTL: RFC 2308's MINIMUM bounds negative answers only, so
// the positive answer keeps the records' TTL, while an NXDOMAIN is still
// kept for MINIMUM.
func TestSOAMinimumOnlyBoundsDenials(t *testing.T) {
	u := newUpstream()
	soa := mustRR(t, "zone.example. 3600 IN SOA ns.zone.example. host.zone.example. 1 7200 3600 1209600 300")
	ns := mustRR(t, "zone.example. 3600 IN NS ns.zone.example.")
	glue := mustRR(t, "ns.zone.example. 3600 IN A 192.0.2.53")
	u.add("zone.example.", dns.TypeSOA, dns.RcodeSuccess, []dns.RR{soa}, []dns.RR{ns}, []dns.RR{glue})
	u.add("nx.zone.example.", dns.TypeA, dns.RcodeNameError, nil, []dns.RR{soa}, nil)
	clk := newClock()
	c := newTestCache(t, u, clk)
	for _, what := range []string{"miss", "hit"} {
		req := new(dns.Msg)
		req.SetQuestion("zone.example.", dns.TypeSOA)
		r := ask(t, c, req, false)
		for _, rr := range append(append(r.Answer, r.Ns...), r.Extra...) {
			if rr.Header().Ttl != 3600 {
				t.Errorf("%s: %s: TTL %d, want the upstream's 3600", what, rr.Header().Name+" "+dns.TypeToString[rr.Header().Rrtype], rr.Header().Ttl)
			}
		}
		if len(r.Answer) != 1 || len(r.Ns) != 1 || len(r.Extra) != 1 {
			t.Fatalf("%s: reply %v", what, r)
		}
	}
	req := new(dns.Msg)
	req.SetQuestion("nx.zone.example.", dns.TypeA)
	if r := ask(t, c, req, false); r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || r.Ns[0].Header().Ttl != 300 {
		t.Errorf("NXDOMAIN: %v; want its SOA with TTL 300, the SOA's MINIMUM", r)
	}
	clk.advance(301 * time.Second)
	ask(t, c, req, false)
	if n := u.count("nx.zone.example.", dns.TypeA); n != 2 {
		t.Errorf("NXDOMAIN asked upstream %d times in 301 s, want 2: it is kept for MINIMUM", n)
	}
}

// TestDNSSECLifetimeApart answers a wildcard query as a signed zone does:
// the synthesized record and its signature with the zone's TTL, the NSEC
// that proves the wildcard with the SOA MINIMUM's. Clients without DO get
// none of the proof, so it must not shorten what they get; DO clients get
// the proof (the first of them upgrades the entry stored for a client
// without DO), so once it has run out they miss and the entry is refreshed.
func TestDNSSECLifetimeApart(t *testing.T) {
	u := newUpstream()
	a := mustRR(t, "x.wild.zone.example. 3600 IN A 192.0.2.77")
	asig := mustRR(t, "x.wild.zone.example. 3600 IN RRSIG A 13 3 3600 20300101000000 20200101000000 12345 zone.example. AAAA")
	nsec := mustRR(t, "w.zone.example. 300 IN NSEC z.wild.zone.example. A RRSIG NSEC")
	nsig := mustRR(t, "w.zone.example. 300 IN RRSIG NSEC 13 3 300 20300101000000 20200101000000 12345 zone.example. AAAA")
	u.add("x.wild.zone.example.", dns.TypeA, dns.RcodeSuccess, []dns.RR{a, asig}, []dns.RR{nsec, nsig}, nil)
	clk := newClock()
	c := newTestCache(t, u, clk)
	query := func(do bool) *dns.Msg {
		req := new(dns.Msg)
		req.SetQuestion("x.wild.zone.example.", dns.TypeA)
		req.SetEdns0(1232, do)
		return ask(t, c, req, false)
	}
	ttls := func(r *dns.Msg) string {
		s := ""
		for _, rr := range append(r.Answer, r.Ns...) {
			s += fmt.Sprintf("%s/%d ", dns.TypeToString[rr.Header().Rrtype], rr.Header().Ttl)
		}
		return s
	}
	for _, step := range []struct {
		wait     time.Duration
		do       bool
		want     string
		upstream int
	}{
		{0, false, "A/3600 ", 1},
		{0, true, "A/3600 RRSIG/3600 NSEC/300 RRSIG/300 ", 2},
		{200 * time.Second, false, "A/3400 ", 2},
		{0, true, "A/3400 RRSIG/3400 NSEC/100 RRSIG/100 ", 2},
		// The proof has run out: a DO client misses and refreshes the entry.
		{100 * time.Second, false, "A/3300 ", 2},
		{0, true, "A/3600 RRSIG/3600 NSEC/300 RRSIG/300 ", 3},
		{0, false, "A/3600 ", 3},
	} {
		clk.advance(step.wait)
		r := query(step.do)
		if got := ttls(r); got != step.want {
			t.Errorf("after %v, DO=%v: TTLs %q, want %q", step.wait, step.do, got, step.want)
		}
		if n := u.count("x.wild.zone.example.", dns.TypeA); n != step.upstream {
			t.Errorf("after %v, DO=%v: %d upstream queries, want %d", step.wait, step.do, n, step.upstream)
		}
	}
}

// TestShortTTLRaisedToMinimum stores records whose TTL is under MINTTL: the
// entry is kept for MINTTL, and the records are served with TTLs counting
// down from it, as the stock cache and Unbound serve them, never 0 while the
// entry lives (a TTL of 0 defeats every cache behind this one).
func TestShortTTLRaisedToMinimum(t *testing.T) {
	u := newUpstream()
	u.add("short.example.", dns.TypeA, dns.RcodeSuccess, []dns.RR{
		mustRR(t, "short.example. 2 IN A 192.0.2.1"),
		mustRR(t, "short.example. 30 IN A 192.0.2.2"),
	}, nil, nil)
	soa := mustRR(t, "example. 1 IN SOA ns.example. host.example. 1 7200 3600 1209600 1")
	u.add("gone.example.", dns.TypeA, dns.RcodeNameError, nil, []dns.RR{soa}, nil)
	clk := newClock()
	c := newTestCache(t, u, clk)
	for _, step := range []struct {
		name string
		wait time.Duration
		want []uint32
	}{
		{"short.example.", 0, []uint32{5, 5}},
		{"short.example.", 2 * time.Second, []uint32{3, 3}},
		{"short.example.", 2 * time.Second, []uint32{1, 1}},
		{"gone.example.", 0, []uint32{5}},
		{"gone.example.", 4 * time.Second, []uint32{1}},
	} {
		clk.advance(step.wait)
		req := new(dns.Msg)
		req.SetQuestion(step.name, dns.TypeA)
		r := ask(t, c, req, false)
		var got []uint32
		for _, rr := range append(r.Answer, r.Ns...) {
			got = append(got, rr.Header().Ttl)
		}
		if fmt.Sprint(got) != fmt.Sprint(step.want) {
			t.Errorf("%s after %v more: TTLs %v, want %v", step.name, step.wait, got, step.want)
		}
	}
	if n := u.count("short.example.", dns.TypeA); n != 1 {
		t.Errorf("%d upstream queries for short.example., want 1", n)
	}
}

// TestECSAnswerWithoutECSNotForECSClients: an answer fetched without ECS
// was tailored to no one (or to this server's own address), so it serves
// clients without ECS and source /0 queries only. A client with ECS misses
// once and asks with its own subnet; an answer with scope 0 then serves
// every client of the family, and clients without ECS keep the answer
// fetched without ECS.
func TestECSAnswerWithoutECSNotForECSClients(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache", g, newClock())
	for i, step := range []struct {
		name, subnet string
		want         string // the network the answer names
		queries      int    // upstream queries for the name so far
	}{
		{"s24.geo.", "", "none", 1},
		{"s24.geo.", "10.1.0.0/24", "10.1.0.0/24", 2},
		{"s24.geo.", "10.2.0.0/24", "10.2.0.0/24", 3},
		{"s24.geo.", "10.1.0.0/24", "10.1.0.0/24", 3},
		{"s24.geo.", "", "none", 3},
		{"s24.geo.", "0.0.0.0/0", "none", 3},
		// Scope 0: the answer to the first ECS client serves its family.
		{"s0.geo.", "", "none", 1},
		{"s0.geo.", "10.1.0.0/24", "0.0.0.0/0", 2},
		{"s0.geo.", "10.9.0.0/24", "0.0.0.0/0", 2},
		{"s0.geo.", "", "none", 2},
	} {
		got, _ := geoAnswer(t, ask(t, c, geoQuery(step.name, step.subnet), false))
		if got != step.want {
			t.Errorf("step %d: %s from %q got the answer for %s, want %s", i, step.name, step.subnet, got, step.want)
		}
		if n := g.count(step.name); n != step.queries {
			t.Errorf("step %d: %s from %q: %d upstream queries, want %d", i, step.name, step.subnet, n, step.queries)
		}
	}
}
