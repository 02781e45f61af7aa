package compactcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	ot "github.com/opentracing/opentracing-go"
	"github.com/opentracing/opentracing-go/mocktracer"
)

func exampleUpstream() *upstream {
	u := newUpstream()
	soa := []dns.RR{test.SOA("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60")}
	u.add("a.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{
		test.A("a.example.org. 300 IN A 192.0.2.1"), test.A("a.example.org. 300 IN A 192.0.2.2"),
	}, nil, nil)
	u.add("a.example.org.", dns.TypeAAAA, dns.RcodeSuccess, []dns.RR{test.AAAA("a.example.org. 300 IN AAAA 2001:db8::1")}, nil, nil)
	u.add("t.example.org.", dns.TypeTXT, dns.RcodeSuccess, []dns.RR{test.TXT(`t.example.org. 300 IN TXT "Mixed Case" "v=spf1 -all"`)}, nil, nil)
	u.add("www.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{
		test.CNAME("www.example.org. 300 IN CNAME web.example.org."),
		test.CNAME("web.example.org. 300 IN CNAME host.example.net."),
		test.A("host.example.net. 60 IN A 192.0.2.9"),
	}, nil, nil)
	u.add("example.org.", dns.TypeMX, dns.RcodeSuccess, []dns.RR{
		test.MX("example.org. 300 IN MX 10 mail.example.org."), test.MX("example.org. 300 IN MX 20 mx.other.example."),
	}, nil, []dns.RR{test.A("mail.example.org. 300 IN A 192.0.2.25")})
	u.add("example.org.", dns.TypeNS, dns.RcodeSuccess, []dns.RR{
		test.NS("example.org. 300 IN NS ns.example.org."), test.NS("example.org. 300 IN NS ns2.example.org."),
	}, nil, []dns.RR{test.A("ns.example.org. 300 IN A 192.0.2.53")})
	u.add("_sip._udp.example.org.", dns.TypeSRV, dns.RcodeSuccess, []dns.RR{
		test.SRV("_sip._udp.example.org. 300 IN SRV 10 5 5060 sip.example.org."),
	}, nil, nil)
	u.add("example.org.", dns.TypeSOA, dns.RcodeSuccess, soa, nil, nil)
	u.add("1.2.0.192.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, []dns.RR{
		test.PTR("1.2.0.192.in-addr.arpa. 300 IN PTR a.example.org."),
	}, nil, nil)
	u.add("missing.example.org.", dns.TypeA, dns.RcodeNameError, nil, soa, nil)
	u.add("a.example.org.", dns.TypeMX, dns.RcodeSuccess, nil, soa, nil)
	return u
}

func TestCacheAnswersAsUpstream(t *testing.T) {
	cases := []test.Case{
		{Qname: "a.example.org.", Qtype: dns.TypeA},
		{Qname: "a.example.org.", Qtype: dns.TypeAAAA},
		{Qname: "t.example.org.", Qtype: dns.TypeTXT},
		{Qname: "www.example.org.", Qtype: dns.TypeA},
		{Qname: "example.org.", Qtype: dns.TypeMX},
		{Qname: "example.org.", Qtype: dns.TypeNS},
		{Qname: "_sip._udp.example.org.", Qtype: dns.TypeSRV},
		{Qname: "example.org.", Qtype: dns.TypeSOA},
		{Qname: "1.2.0.192.in-addr.arpa.", Qtype: dns.TypePTR},
		{Qname: "missing.example.org.", Qtype: dns.TypeA}, // NXDOMAIN
		{Qname: "a.example.org.", Qtype: dns.TypeMX},      // NODATA
		{Qname: "A.Example.ORG.", Qtype: dns.TypeA},       // 0x20
		{Qname: "WWW.example.org.", Qtype: dns.TypeA, Do: true},
	}
	for _, raw := range []bool{false, true} {
		u := exampleUpstream()
		c := newTestCache(t, u, newClock())
		c.SetRawWrites(raw)
		for _, tc := range cases {
			req := tc.Msg()
			want := u.script(tc.Qname, tc.Qtype)(req)
			for i := range 2 {
				got := ask(t, c, req, false)
				if err := sameReply(got, want); err != nil {
					t.Errorf("raw=%v %s/%s query %d: %v", raw, tc.Qname, dns.TypeToString[tc.Qtype], i, err)
				}
				if got.Question[0].Name != tc.Qname {
					t.Errorf("raw=%v %s: question echoed as %q", raw, tc.Qname, got.Question[0].Name)
				}
				for _, rr := range got.Answer {
					if strings.EqualFold(rr.Header().Name, tc.Qname) && rr.Header().Name != tc.Qname {
						t.Errorf("raw=%v %s: owner %q lost the client's case", raw, tc.Qname, rr.Header().Name)
					}
				}
				if got.Id != req.Id {
					t.Errorf("raw=%v %s: reply ID %d, want %d", raw, tc.Qname, got.Id, req.Id)
				}
			}
			if n := u.count(tc.Qname, tc.Qtype); n != 1 {
				t.Errorf("raw=%v %s/%s: upstream asked %d times, want 1", raw, tc.Qname, dns.TypeToString[tc.Qtype], n)
			}
		}
		if got := c.Stats().Entries; got != int64(len(cases)-2) {
			t.Errorf("raw=%v: %d entries, want %d", raw, got, len(cases)-2)
		}
	}
}

func TestTTLAging(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := newTestCache(t, u, clk)
	req := test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)

	clk.advance(20 * time.Second)
	got := ask(t, c, req, false)
	want := map[uint16]uint32{dns.TypeCNAME: 280, dns.TypeA: 40} // 300 and 60 aged by 20; entry TTL is 60
	for _, rr := range got.Answer {
		if rr.Header().Ttl != want[rr.Header().Rrtype] && !(rr.Header().Rrtype == dns.TypeCNAME && rr.Header().Ttl == 40) {
			t.Errorf("%s: TTL %d", rr, rr.Header().Ttl)
		}
	}
	// The entry's TTL is the smallest, 60: each record's TTL is capped by it.
	for _, rr := range got.Answer {
		if rr.Header().Ttl != 40 {
			t.Errorf("%s: TTL %d, want 40", rr, rr.Header().Ttl)
		}
	}
	if n := u.count("www.example.org.", dns.TypeA); n != 1 {
		t.Fatalf("upstream asked %d times before expiry, want 1", n)
	}
	clk.advance(41 * time.Second)
	ask(t, c, req, false)
	if n := u.count("www.example.org.", dns.TypeA); n != 2 {
		t.Fatalf("upstream asked %d times after expiry, want 2", n)
	}
}

func TestKeepTTL(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := newTestCache(t, u, clk)
	c.KeepTTL = true
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)
	clk.advance(100 * time.Second)
	for _, rr := range ask(t, c, req, false).Answer {
		if rr.Header().Ttl != 300 {
			t.Errorf("%s: TTL %d, want 300 with keepttl", rr, rr.Header().Ttl)
		}
	}
}

func bigTXT(name string, n int) []dns.RR {
	var rrs []dns.RR
	for i := range n {
		rrs = append(rrs, test.TXT(name+` 300 IN TXT "`+strings.Repeat(string(rune('a'+i%26)), 100)+`"`))
	}
	return rrs
}

func TestTruncation(t *testing.T) {
	u := newUpstream()
	u.add("big.example.org.", dns.TypeTXT, dns.RcodeSuccess, bigTXT("big.example.org.", 20), nil, nil)
	u.add("glue.example.org.", dns.TypeNS, dns.RcodeSuccess,
		[]dns.RR{test.NS("glue.example.org. 300 IN NS ns1.example.org.")},
		nil, bigTXT("ns1.example.org.", 8))
	c := newTestCache(t, u, newClock())

	for _, tc := range []struct {
		name     string
		req      *dns.Msg
		tcp      bool
		tc       bool
		answers  int
		maxBytes int
	}{
		{"udp no edns", test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg(), false, true, 0, 512},
		{"udp edns 4096", withEDNS(test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg(), 4096), false, false, 20, 4096},
		{"udp edns 1232", withEDNS(test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg(), 1232), false, true, 0, 1232},
		{"tcp", test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg(), true, false, 20, dns.MaxMsgSize},
		// Additional records go first, without TC.
		{"glue udp", test.Case{Qname: "glue.example.org.", Qtype: dns.TypeNS}.Msg(), false, false, 1, 512},
	} {
		for i := range 2 { // miss, then hit
			got := ask(t, c, tc.req, tc.tcp)
			b, _ := got.Pack()
			if got.Truncated != tc.tc || len(got.Answer) != tc.answers || len(b) > tc.maxBytes {
				t.Errorf("%s query %d: TC=%v, %d answers, %d bytes; want TC=%v, %d answers, at most %d bytes",
					tc.name, i, got.Truncated, len(got.Answer), len(b), tc.tc, tc.answers, tc.maxBytes)
			}
		}
	}
}

func withEDNS(m *dns.Msg, size uint16) *dns.Msg {
	m.SetEdns0(size, false)
	return m
}

func TestNotCached(t *testing.T) {
	u := newUpstream()
	u.add("refused.example.org.", dns.TypeA, dns.RcodeRefused, nil, nil, nil)
	u.add("nosoa.example.org.", dns.TypeA, dns.RcodeNameError, nil, nil, nil)
	u.set("tc.example.org.", dns.TypeA, func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Truncated = true
		return m
	})
	u.set("other.example.org.", dns.TypeA, func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Question[0].Name = "evil.example.org."
		m.Answer = []dns.RR{test.A("evil.example.org. 300 IN A 192.0.2.66")}
		return m
	})
	c := newTestCache(t, u, newClock())
	for name, want := range map[string]int{
		"refused.example.org.": 2,
		"nosoa.example.org.":   2,
		"tc.example.org.":      4, // each truncated UDP reply is asked again over TCP
		"other.example.org.":   2,
	} {
		req := test.Case{Qname: name, Qtype: dns.TypeA}.Msg()
		ask(t, c, req, false)
		if got := ask(t, c, req, false); name == "tc.example.org." && !got.Truncated {
			t.Errorf("%s: the client did not get the truncated reply", name)
		}
		if n := u.count(name, dns.TypeA); n != want {
			t.Errorf("%s: upstream asked %d times, want %d (not cached)", name, n, want)
		}
	}
	if n := c.Stats().Entries; n != 0 {
		t.Errorf("%d entries stored, want 0", n)
	}
}

func TestTruncatedUpstreamRetriedOverTCP(t *testing.T) {
	u := newUpstream()
	answer := bigTXT("big.example.org.", 20)
	var transports []string
	u.set("big.example.org.", dns.TypeTXT, func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = answer
		return m
	})
	c := newTestCache(t, u, newClock())
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		_, tcp := w.RemoteAddr().(*net.TCPAddr)
		transports = append(transports, map[bool]string{true: "tcp", false: "udp"}[tcp])
		if !tcp {
			m := new(dns.Msg)
			m.SetReply(r)
			m.Truncated = true
			return dns.RcodeSuccess, w.WriteMsg(m)
		}
		return u.ServeDNS(ctx, w, r)
	})
	req := withEDNS(test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg(), 4096)
	for range 2 {
		if got := ask(t, c, req, false); got.Truncated || len(got.Answer) != len(answer) {
			t.Fatalf("TC=%v with %d answers, want the whole answer", got.Truncated, len(got.Answer))
		}
	}
	if strings.Join(transports, ",") != "udp,tcp" {
		t.Fatalf("upstream asked over %v, want udp then tcp, then nothing (cached)", transports)
	}
}

func TestServfailCachedWhenNextFails(t *testing.T) {
	u := newUpstream() // answers nothing: SERVFAIL with an error
	clk := newClock()
	c := newTestCache(t, u, clk)
	req := test.Case{Qname: "down.example.org.", Qtype: dns.TypeA}.Msg()
	rec := &recorder{}
	rcode, err := c.ServeDNS(t.Context(), rec, req)
	if rcode != dns.RcodeServerFailure || err == nil {
		t.Fatalf("first query: rcode %d err %v, want SERVFAIL and an error", rcode, err)
	}
	got := ask(t, c, req, false)
	if got.Rcode != dns.RcodeServerFailure {
		t.Fatalf("cached reply rcode %s, want SERVFAIL", dns.RcodeToString[got.Rcode])
	}
	if n := u.count("down.example.org.", dns.TypeA); n != 1 {
		t.Fatalf("upstream asked %d times within the servfail time, want 1", n)
	}
	clk.advance(config.ServfailTTL)
	c.ServeDNS(t.Context(), &recorder{}, req)
	if n := u.count("down.example.org.", dns.TypeA); n != 2 {
		t.Fatalf("upstream asked %d times after the servfail time, want 2", n)
	}
}

func TestUpstreamGetsDO(t *testing.T) {
	u := exampleUpstream()
	c := newTestCache(t, u, newClock())
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)
	o := u.last.IsEdns0()
	if o == nil || !o.Do() || o.UDPSize() < upstreamUDPSize {
		t.Fatalf("upstream request OPT %v, want DO and a buffer of at least %d", o, upstreamUDPSize)
	}
	if req.IsEdns0() != nil {
		t.Fatal("the client's request was changed")
	}
}

func TestHitAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector; .ci/run runs this test without it")
	}
	u := exampleUpstream()
	c := newTestCache(t, u, newClock())
	c.SetRawWrites(true)
	req := test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)
	w := &discard{}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := c.ServeDNS(t.Context(), w, req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 || w.n == 0 {
		t.Fatalf("%v allocations per hit, %d bytes written; want 0 allocations", allocs, w.n)
	}
}

// TestMissAllocatesNothing: on the raw path a miss allocates nothing of its
// own, the upstream's reply aside: the fetch and the scratch are pooled, the
// entry is built in reused buffers, and the next plugin is asked without
// plugin.NextOrFailure's writer.
func TestMissAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector; .ci/run runs this test without it")
	}
	const runs = 1000
	replies, _ := workloadReplies(t, runs+1) // AllocsPerRun warms up with one run
	reqs := make([]*dns.Msg, len(replies))
	for i, m := range replies {
		reqs[i] = new(dns.Msg).SetQuestion(m.Question[0].Name, m.Question[0].Qtype)
	}
	up := &cannedUpstream{replies: replies}
	c := New()
	c.Next = up
	c.SetRawWrites(true)
	w := &discard{}
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := c.ServeDNS(t.Context(), w, reqs[up.next]); err != nil {
			t.Fatal(err)
		}
		up.next++
	})
	if allocs != 0 || c.Stats().Entries != runs+1 {
		t.Fatalf("%v allocations per miss, %d entries stored; want 0 allocations, %d entries", allocs, c.Stats().Entries, runs+1)
	}
}

// TestMissTracesTheNextPlugin: under a traced request, the next plugin runs
// in a span of its own, a child of the request's, as plugin.NextOrFailure
// would give it.
func TestMissTracesTheNextPlugin(t *testing.T) {
	tracer := mocktracer.New()
	root := tracer.StartSpan("request")
	u := exampleUpstream()
	c := newTestCache(t, u, newClock())
	var inside ot.Span
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		inside = ot.SpanFromContext(ctx)
		return u.ServeDNS(ctx, w, r)
	})
	ctx := ot.ContextWithSpan(context.Background(), root)
	if _, err := c.ServeDNS(ctx, &recorder{}, test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()); err != nil {
		t.Fatal(err)
	}
	spans := tracer.FinishedSpans()
	if len(spans) != 1 || inside != ot.Span(spans[0]) {
		t.Fatalf("%d spans finished; want one, the one the next plugin ran in", len(spans))
	}
	if s := spans[0]; s.OperationName != c.Next.Name() || s.ParentID != root.(*mocktracer.MockSpan).SpanContext.SpanID {
		t.Fatalf("the next plugin's span %q, parent %d; want %q, a child of the request's span", s.OperationName, s.ParentID, c.Next.Name())
	}
}

// discard is a ResponseWriter that counts written bytes and keeps nothing.
type discard struct {
	test.ResponseWriter
	n int
}

var clientAddr = &net.UDPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 40212}

// RemoteAddr returns a fixed address: test.ResponseWriter allocates one per call.
func (d *discard) RemoteAddr() net.Addr { return clientAddr }

func (d *discard) Write(b []byte) (int, error) { d.n += len(b); return len(b), nil }

// TestConcurrentMissesAskOnce: a thousand clients asking one new name at
// once cost one upstream query; the stock cache sends one each. The first
// has DO: the entry its fetch stores serves the others, DO or not.
func TestConcurrentMissesAskOnce(t *testing.T) {
	u := exampleUpstream()
	release := make(chan struct{})
	c := newTestCache(t, u, newClock())
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		<-release // hold the upstream until every client is waiting
		return u.ServeDNS(ctx, w, r)
	})
	const clients = 1000
	var wg sync.WaitGroup
	replies := make(chan *dns.Msg, clients)
	for i := range clients {
		if i == 1 {
			await(t, "the first client to lead", func() bool { return c.flights.InFlight() == 1 })
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA, Do: i%2 == 0}.Msg()
			req.Id = uint16(i)
			rec := &recorder{}
			if _, err := c.ServeDNS(context.Background(), rec, req); err != nil || rec.msg == nil {
				t.Errorf("client %d: %v, reply %v", i, err, rec.msg)
				return
			}
			if rec.msg.Id != req.Id || len(rec.msg.Answer) != 2 {
				t.Errorf("client %d: reply ID %d with %d answers", i, rec.msg.Id, len(rec.msg.Answer))
			}
			replies <- rec.msg
		}()
	}
	releaseFlight(t, c, release, &wg, clients-1)
	if n := u.count("a.example.org.", dns.TypeA); n != 1 {
		t.Fatalf("%d concurrent clients made %d upstream queries, want 1", clients, n)
	}
	if len(replies) != clients {
		t.Fatalf("%d of %d clients answered", len(replies), clients)
	}
}

// TestMissAfterLanding: a miss whose lookup came before another request's
// fetch of its question landed, and which leads a flight of its own after
// it, serves what that fetch stored instead of fetching again; a crowd of
// clients asking one name as its entry expires made one upstream query for
// each that fell between the two. The request is given to miss as
// ServeDNS gives it after a lookup that found nothing. When the fetch
// stored nothing (`disable success`), the miss fetches.
func TestMissAfterLanding(t *testing.T) {
	for _, tc := range []struct {
		name    string
		disable bool
		want    int // upstream queries
	}{
		{"stored", false, 1},
		{"not stored", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := exampleUpstream()
			c := newTestCache(t, u, newClock())
			if tc.disable {
				c.DisableSuccess = []string{"example.org."}
			}
			req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
			ask(t, c, req, false)

			rec := &recorder{}
			s := scratchPool.Get().(*scratch)
			defer scratchPool.Put(s)
			if !s.readMsg(req, rec, &c.ecs) {
				t.Fatal("the request is not read")
			}
			ctx := context.Background()
			if _, err := c.miss(ctx, rec, req, s, &found{}, c.metrics.Server(metrics.WithServer(ctx))); err != nil || rec.msg == nil {
				t.Fatalf("miss: %v, reply %v", err, rec.msg)
			}
			if m := rec.msg; m.Rcode != dns.RcodeSuccess || len(m.Answer) != 2 {
				t.Errorf("miss: reply %v", m)
			}
			if n := u.count("a.example.org.", dns.TypeA); n != tc.want {
				t.Errorf("upstream asked %d times, want %d", n, tc.want)
			}
			if n := c.flights.InFlight(); n != 0 {
				t.Errorf("%d flights left", n)
			}
		})
	}
}

// TestPassedOnRcodes: a reply the cache does not store reaches the client
// with its RCODE, whatever the rcodes an entry keeps; an extended one with
// its upper bits in OPT, or as SERVFAIL to a client without EDNS.
func TestPassedOnRcodes(t *testing.T) {
	for _, rcode := range []int{dns.RcodeNotImplemented, dns.RcodeRefused, dns.RcodeYXDomain, dns.RcodeNotAuth, dns.RcodeNotZone, dns.RcodeBadCookie} {
		for _, edns := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s edns=%v", dns.RcodeToString[rcode], edns), func(t *testing.T) {
				u := newUpstream()
				u.add("r.example.org.", dns.TypeA, rcode, nil, nil, nil)
				c := newTestCache(t, u, newClock())
				req := test.Case{Qname: "r.example.org.", Qtype: dns.TypeA}.Msg()
				if edns {
					req.SetEdns0(1232, false)
				}
				want := rcode
				if rcode > 0xF && !edns {
					want = dns.RcodeServerFailure
				}
				for i := range 2 {
					// ask packs and unpacks the reply: the upper bits travel in OPT.
					if got := ask(t, c, req, false); got.Rcode != want {
						t.Errorf("query %d: rcode %s, want %s", i, dns.RcodeToString[got.Rcode], dns.RcodeToString[want])
					}
				}
			})
		}
	}
}

// releaseFlight waits for waiters clients of wg to wait on c's one flight, then
// lets its upstream answer (release) and waits for the clients.
func releaseFlight(t *testing.T, c *Cache, release chan struct{}, wg *sync.WaitGroup, waiters int) {
	t.Helper()
	await(t, "every client to wait", func() bool {
		flights, joined := c.flights.Waiting()
		return flights == 1 && joined == waiters
	})
	close(release)
	wg.Wait()
}

// TestWaitersGetAnUncachedReply: clients that waited for a fetch whose reply
// is not stored (`disable success`) each get it written for them, with their own ID and
// question case, the signature only for DO clients, from one upstream query.
func TestWaitersGetAnUncachedReply(t *testing.T) {
	u := newUpstream()
	u.add("uncached.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{
		test.A("uncached.example.org. 300 IN A 192.0.2.1"),
		test.RRSIG("uncached.example.org. 300 IN RRSIG A 8 3 300 20300101000000 20200101000000 12345 example.org. AAAA"),
	}, nil, nil)
	release := make(chan struct{})
	c := newTestCache(t, u, newClock())
	c.DisableSuccess = []string{"example.org."}
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		<-release
		return u.ServeDNS(ctx, w, r)
	})
	const clients = 200
	var wg sync.WaitGroup
	for i := range clients {
		if i == 1 {
			// A DO client leads the flight: the others, with DO or
			// without, can all wait for its answer.
			await(t, "the first client's flight", func() bool { return c.flights.InFlight() == 1 })
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := []string{"uncached.example.org.", "UNCACHED.example.ORG."}[i%3%2]
			do := i%2 == 0
			req := test.Case{Qname: name, Qtype: dns.TypeA, Do: do}.Msg()
			req.Id = uint16(i)
			rec := &recorder{}
			if _, err := c.ServeDNS(context.Background(), rec, req); err != nil || rec.msg == nil {
				t.Errorf("client %d: %v, reply %v", i, err, rec.msg)
				return
			}
			want := 1
			if do {
				want = 2
			}
			if m := rec.msg; m.Id != req.Id || m.Question[0].Name != name || len(m.Answer) != want || m.Rcode != dns.RcodeSuccess {
				t.Errorf("client %d (%s, DO=%v): reply %v", i, name, do, m)
			}
		}()
	}
	releaseFlight(t, c, release, &wg, clients-1)
	if n := u.count("uncached.example.org.", dns.TypeA); n != 1 {
		t.Errorf("%d concurrent clients made %d upstream queries, want 1", clients, n)
	}
	if n := c.Stats().Entries; n != 0 {
		t.Errorf("%d entries stored of a reply of a disabled zone", n)
	}
}

// TestMissLandsWhenNextPanics: when the next plugin panics under a miss (the
// server recovers), the clients that waited for that miss's answer get
// SERVFAIL instead of waiting forever, and no flight is left behind.
func TestMissLandsWhenNextPanics(t *testing.T) {
	u := exampleUpstream()
	release := make(chan struct{})
	var asked atomic.Bool
	c := newTestCache(t, u, newClock())
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if asked.Swap(true) {
			return u.ServeDNS(ctx, w, r) // only the first fetch fails
		}
		<-release
		panic("the next plugin fails")
	})
	ask := func() (int, error) {
		return c.ServeDNS(context.Background(), &recorder{}, test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())
	}
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		ask()
	}()
	await(t, "the leader's flight", func() bool { return c.flights.InFlight() == 1 })
	type result struct {
		rcode int
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		rcode, err := ask()
		waited <- result{rcode, err}
	}()
	await(t, "the waiter to join the flight", func() bool { _, waiters := c.flights.Waiting(); return waiters > 0 })
	close(release)
	if p := <-panicked; p == nil {
		t.Fatal("the leader's ServeDNS returned: the next plugin's panic was lost")
	}
	select {
	case r := <-waited:
		if r.rcode != dns.RcodeServerFailure || r.err == nil {
			t.Errorf("the waiter got rcode %d, error %v; want SERVFAIL and an error", r.rcode, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter is still waiting for the flight of a miss whose next plugin panicked")
	}
	if n := c.flights.InFlight(); n != 0 {
		t.Fatalf("%d flights left after the panic", n)
	}
}

// TestFailedFetchOneReply: the clients of a fetch that failed, its leader
// and a waiter, get one reply each: the server writes SERVFAIL for a handler
// whose rcode says it wrote nothing (plugin.ClientWrite), so the cache, once
// it wrote, says so whatever the next plugin's rcode. The next plugin fails
// without writing (stored for the servfail time, or not), or writes its
// SERVFAIL and returns that rcode too.
func TestFailedFetchOneReply(t *testing.T) {
	for _, tc := range []struct {
		servfail time.Duration
		writes   bool
	}{{0, false}, {5 * time.Second, false}, {0, true}, {5 * time.Second, true}} {
		t.Run(fmt.Sprintf("servfail=%v writes=%v", tc.servfail, tc.writes), func(t *testing.T) {
			release := make(chan struct{})
			c := newTestCache(t, newUpstream(), newClock())
			c.ServfailTTL = tc.servfail
			c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
				<-release
				if tc.writes {
					m := new(dns.Msg)
					m.SetRcode(r, dns.RcodeServerFailure)
					return dns.RcodeServerFailure, w.WriteMsg(m)
				}
				return dns.RcodeServerFailure, errors.New("no upstream answered")
			})
			// replies counts what a client receives: what the cache
			// wrote, and the server's SERVFAIL when the rcode says
			// nothing was written.
			replies := func() int {
				rec := &recorder{}
				rcode, _ := c.ServeDNS(context.Background(), rec, test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())
				if !plugin.ClientWrite(rcode) {
					return rec.writes + 1
				}
				return rec.writes
			}
			got := make(chan int, 2)
			go func() { got <- replies() }()
			await(t, "the leader's flight", func() bool { return c.flights.InFlight() == 1 })
			go func() { got <- replies() }()
			await(t, "the waiter to join the flight", func() bool { _, waiters := c.flights.Waiting(); return waiters == 1 })
			close(release)
			for _, who := range []string{"one client", "the other"} {
				if n := <-got; n != 1 {
					t.Errorf("%s received %d replies, want 1", who, n)
				}
			}
		})
	}
}

// TestClockReadsPerRequest: a miss reads the clock once, when it stores the
// reply (the lookup found nothing to age), and a hit once, to age the entry.
// A front-end hit reads none: it ages the entry by the time its batch came
// in, which the front end reads itself, once a batch.
func TestClockReadsPerRequest(t *testing.T) {
	clk := newClock()
	c := newTestCache(t, exampleUpstream(), clk)
	reads := 0
	c.now = func() time.Time { reads++; return clk.now() }
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	for i, what := range []string{"miss", "hit"} {
		reads = 0
		if m := ask(t, c, req, false); len(m.Answer) != 2 {
			t.Fatalf("%s: %d answers, want 2", what, len(m.Answer))
		}
		if reads != 1 {
			t.Errorf("a %s read the clock %d times, want 1", what, reads)
		}
		if n := c.Stats().Entries; n != 1 {
			t.Fatalf("after request %d: %d entries, want 1", i+1, n)
		}
	}
	pkt, err := req.Pack()
	if err != nil {
		t.Fatal(err)
	}
	reads = 0
	a := frontCache{c}.Answerer("test")
	var hit frontend.Hit
	if a.Answer(pkt, netip.Addr{}, false, clk.now(), &hit) == nil {
		t.Fatal("the front end did not answer the hit")
	}
	if reads != 0 {
		t.Errorf("a front-end hit read the clock %d times, want 0", reads)
	}
}

// TestTransfersPassThrough: a zone transfer reaches the client as the next
// plugin (transfer) writes it: every message of the stream, each record as
// the zone holds it, its DNSSEC records too for a client without DO; and
// nothing of it is stored.
func TestTransfersPassThrough(t *testing.T) {
	zone := []dns.RR{
		test.SOA("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60"),
		test.A("a.example.org. 300 IN A 192.0.2.1"),
		test.A("a.example.org. 300 IN A 192.0.2.2"),
		test.RRSIG("a.example.org. 300 IN RRSIG A 8 3 300 20300101000000 20200101000000 12345 example.org. AAAA"),
		test.NSEC("a.example.org. 60 IN NSEC b.example.org. A RRSIG NSEC"),
		test.SOA("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60"),
	}
	for _, qtype := range []uint16{dns.TypeAXFR, dns.TypeIXFR} {
		t.Run(dns.TypeToString[qtype], func(t *testing.T) {
			c := newTestCache(t, newUpstream(), newClock())
			c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
				// Two messages, as transfer splits a zone.
				for _, part := range [][]dns.RR{zone[:2], zone[2:]} {
					m := new(dns.Msg)
					m.SetReply(r)
					m.Answer = part
					if err := w.WriteMsg(m); err != nil {
						return dns.RcodeServerFailure, err
					}
				}
				return dns.RcodeSuccess, nil
			})
			for i := range 2 {
				rec := &streamRecorder{}
				if _, err := c.ServeDNS(context.Background(), rec, test.Case{Qname: "example.org.", Qtype: qtype}.Msg()); err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, m := range rec.msgs {
					for _, rr := range m.Answer {
						got = append(got, rr.String())
					}
				}
				var want []string
				for _, rr := range zone {
					want = append(want, rr.String())
				}
				if len(rec.msgs) != 2 || strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Errorf("transfer %d: %d messages of\n%s\nwant 2 of\n%s", i, len(rec.msgs), strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
			if n := c.Stats().Entries; n != 0 {
				t.Errorf("%d entries stored of a transfer", n)
			}
		})
	}
}

// streamRecorder keeps every message written, as a TCP client of a stream
// reads them.
type streamRecorder struct {
	test.ResponseWriter
	msgs []*dns.Msg
}

func (r *streamRecorder) WriteMsg(m *dns.Msg) error {
	r.msgs = append(r.msgs, m.Copy())
	return nil
}

// TestFrontendCountsPopularityOnce: a request the front end looks up and
// hands to the chain (a stale entry, one due for a prefetch) is one request
// towards prefetch's AMOUNT, as in plugin mode; counted by both lookups, an
// entry asked fewer times than AMOUNT was prefetched.
func TestFrontendCountsPopularityOnce(t *testing.T) {
	fetches := map[bool]int{}
	for _, front := range []bool{false, true} {
		u := exampleUpstream()
		clk := newClock()
		c := newTestCache(t, u, clk)
		c.StaleUpTo, c.Prefetch, c.PrefetchWindow, c.PrefetchPercentage = time.Hour, 3, time.Hour, 10
		if err := c.init(); err != nil {
			t.Fatal(err)
		}
		req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
		pkt, err := req.Pack()
		if err != nil {
			t.Fatal(err)
		}
		a := frontCache{c}.Answerer("test")
		query := func() {
			if front {
				var hit frontend.Hit
				if a.Answer(pkt, netip.MustParseAddr("127.0.0.1"), false, clk.now(), &hit) != nil {
					return
				}
			}
			ask(t, c, req, false)
		}
		query()                        // the miss
		clk.advance(301 * time.Second) // stale: the request refreshes it
		query()
		await(t, "the refresh", func() bool { return u.count("a.example.org.", dns.TypeA) == 2 && !c.refreshes.running() })
		clk.advance(280 * time.Second) // in the prefetch window, asked a third time
		query()
		await(t, "no refresh running", func() bool { return !c.refreshes.running() })
		fetches[front] = u.count("a.example.org.", dns.TypeA)
	}
	if fetches[true] != fetches[false] || fetches[false] != 2 {
		t.Errorf("upstream asked %d times through the front end's path, %d in plugin mode, want 2 each: 3 requests and prefetch 3", fetches[true], fetches[false])
	}
}

// TestNextPluginErrorReturned: a next plugin that writes its reply and also
// returns an error has the error returned, for the errors plugin to log, with
// its rcode as the stock cache returns them; a rcode that says nothing was
// written (plugin.ClientWrite) becomes NOERROR, as the cache wrote. So on a
// miss, and on a verify of a stale entry that the reply refreshes.
func TestNextPluginErrorReturned(t *testing.T) {
	failed := errors.New("the upstream's reply came late")
	for _, tc := range []struct {
		name         string
		rcode, wrote int
		verify       bool
		want         int
	}{
		{"miss", dns.RcodeSuccess, dns.RcodeSuccess, false, dns.RcodeSuccess},
		{"miss NXDOMAIN", dns.RcodeNameError, dns.RcodeNameError, false, dns.RcodeNameError},
		{"miss SERVFAIL", dns.RcodeServerFailure, dns.RcodeServerFailure, false, dns.RcodeSuccess},
		{"verify", dns.RcodeSuccess, dns.RcodeSuccess, true, dns.RcodeSuccess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			u := exampleUpstream()
			c := newTestCache(t, u, clk)
			c.StaleUpTo, c.VerifyStale = time.Hour, tc.verify
			req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
			if tc.verify {
				ask(t, c, req, false)
				clk.advance(time.Hour / 2)
			}
			c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
				m := new(dns.Msg)
				m.SetRcode(r, tc.wrote)
				if tc.wrote == dns.RcodeSuccess {
					m.Answer = []dns.RR{test.A("a.example.org. 300 IN A 192.0.2.7")}
				}
				w.WriteMsg(m)
				return tc.rcode, failed
			})
			rec := &recorder{}
			rcode, err := c.ServeDNS(context.Background(), rec, req)
			if rcode != tc.want || !errors.Is(err, failed) || rec.writes != 1 {
				t.Fatalf("rcode %d, error %v, %d replies written; want %d, %q, 1", rcode, err, rec.writes, tc.want, failed)
			}
		})
	}
}

// TestWaiterServedStaleCounted: a miss that waited for another's fetch, and
// finds the entry it stored stale by the time it reads it, is served the
// stale entry counted in served_stale_total, once, as a stale hit is.
func TestWaiterServedStaleCounted(t *testing.T) {
	ctx := hostileServer("waiter-served-stale")
	clk := newClock()
	u := exampleUpstream()
	c := newTestCache(t, u, clk)
	c.StaleUpTo = time.Hour
	release := make(chan struct{})
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		<-release
		rcode, err := u.ServeDNS(ctx, w, r)
		clk.advance(time.Hour / 2) // past the TTL of what it wrote, before the waiter reads it
		return rcode, err
	})
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	got := make(chan *dns.Msg, 2)
	serve := func() {
		rec := &recorder{}
		c.ServeDNS(ctx, rec, req.Copy())
		got <- rec.msg
	}
	go serve()
	await(t, "the leader's flight", func() bool { return c.flights.InFlight() == 1 })
	go serve()
	await(t, "the waiter to join the flight", func() bool { _, waiters := c.flights.Waiting(); return waiters == 1 })
	close(release)
	for range 2 {
		if m := <-got; m == nil || len(m.Answer) != 2 {
			t.Fatalf("a client got %v, want the two answers", m)
		}
	}
	labels := map[string]string{"server": "hostile://waiter-served-stale", "zones": "", "view": ""}
	if n := seriesValue(t, "coredns_compactcache_served_stale_total", labels); n != 1 {
		t.Fatalf("served_stale_total %v, want 1: the waiter's stale entry", n)
	}
}

// TestHitDuringRefreshAllocatesNothing: a hit that would refresh its entry,
// stale under serve_stale or popular near expiry, while a refresh of the
// entry is in flight starts none and allocates nothing: the refresh's copy of
// the request is made only when the refresh begins.
func TestHitDuringRefreshAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector; .ci/run runs this test without it")
	}
	for _, tc := range []struct {
		name, corefile string
		advance        time.Duration
	}{
		{"stale", "compactcache {\n serve_stale 1h immediate\n}", 301 * time.Second},
		{"prefetch", "compactcache {\n prefetch 1 10m 50%\n}", 200 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := exampleUpstream()
			clk := newClock()
			c := parseCache(t, tc.corefile, u, clk)
			c.SetRawWrites(true)
			req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
			ask(t, c, req, false)
			asked, release := u.hold("a.example.org. 300 IN A 192.0.2.1")
			defer close(release)
			clk.advance(tc.advance)
			w := &discard{}
			if _, err := c.ServeDNS(t.Context(), w, req); err != nil {
				t.Fatal(err)
			}
			<-asked // the refresh is in flight, held
			allocs := testing.AllocsPerRun(1000, func() {
				if _, err := c.ServeDNS(t.Context(), w, req); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 || u.count("a.example.org.", dns.TypeA) != 2 {
				t.Fatalf("%v allocations per hit, upstream asked %d times; want 0 allocations, 2 asks", allocs, u.count("a.example.org.", dns.TypeA))
			}
		})
	}
}

// TestUpstreamBufferSize: a miss goes upstream with an EDNS buffer of 1232,
// or the client's own when larger, as README says.
func TestUpstreamBufferSize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size, want uint16 // size 0: no OPT
	}{{"no EDNS", 0, 1232}, {"512", 512, 1232}, {"1232", 1232, 1232}, {"4096", 4096, 4096}} {
		t.Run(tc.name, func(t *testing.T) {
			u := exampleUpstream()
			c := newTestCache(t, u, newClock())
			req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
			if tc.size > 0 {
				withEDNS(req, tc.size)
			}
			ask(t, c, req, false)
			if o := u.last.IsEdns0(); o == nil || o.UDPSize() != tc.want {
				t.Fatalf("upstream request OPT %v, want a buffer of %d", o, tc.want)
			}
		})
	}
}

// countedRdata is the rdata of a private type that counts how often it is
// packed: a reply holding it tells how often the cache built an entry of it.
type countedRdata struct{ packs *int }

func (d countedRdata) String() string                  { return "counted" }
func (d countedRdata) Parse([]string) error            { return nil }
func (d countedRdata) Pack(b []byte) (int, error)      { *d.packs++; return copy(b, "ab"), nil }
func (d countedRdata) Unpack(b []byte) (int, error)    { return len(b), nil }
func (d countedRdata) Copy(dst dns.PrivateRdata) error { return nil }
func (d countedRdata) Len() int                        { return 2 }

// TestMissBuildsTooLargeOnce: a miss whose reply is too large for an entry
// builds it twice, once to find it too large and once for the client, not a
// third time to tell whether it could be passed on; the client gets it whole.
func TestMissBuildsTooLargeOnce(t *testing.T) {
	packs := 0
	reply := func(r *dns.Msg) *dns.Msg {
		counted := &dns.PrivateRR{Hdr: dns.RR_Header{Name: "big.example.org.", Rrtype: 65400, Class: dns.ClassINET, Ttl: 300}, Data: countedRdata{&packs}}
		return hostileReply(r, dns.RcodeSuccess, append(txtRecords("big.example.org.", 4, 255), counted), nil, nil)
	}
	req := test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg()
	key := entry.AppendKey(nil, []byte("\x03big\x07example\x03org\x00"), dns.TypeTXT, dns.ClassINET, false)
	if _, err := entry.NewBuilder().Build(reply(req), key, "big.example.org.", 1, 300, 0, 0, config.DefaultMaxEntry); err != nil || packs == 0 {
		t.Fatalf("build: %v, %d packs", err, packs)
	}
	build := packs
	for _, tc := range []struct {
		name     string
		maxEntry int
		entries  int64
		builds   int
	}{{"stored", config.DefaultMaxEntry, 1, 1}, {"too large", 512, 0, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			packs = 0
			u := newUpstream()
			u.set("big.example.org.", dns.TypeTXT, reply)
			c := newTestCache(t, u, newClock())
			c.MaxEntry = tc.maxEntry
			got := ask(t, c, req, true)
			if len(got.Answer) != 5 || got.Answer[4].Header().Rrtype != 65400 || c.Stats().Entries != tc.entries {
				t.Fatalf("reply %v, %d entries; want the 5 records, %d entries", got, c.Stats().Entries, tc.entries)
			}
			if packs != tc.builds*build {
				t.Fatalf("the reply built %v times, want %d", float64(packs)/float64(build), tc.builds)
			}
		})
	}
}
