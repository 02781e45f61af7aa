package compactcache

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestPrefetchInheritsPopularity: an entry refreshed by prefetch keeps the
// popularity of the entry it replaces (README, prefetch), so that a name
// asked often enough is prefetched again near its next expiry by one more
// hit, an ECS variant as much as the answer for everyone.
func TestPrefetchInheritsPopularity(t *testing.T) {
	for _, subnet := range []string{"", "10.1.2.0/24"} {
		t.Run(subnet, func(t *testing.T) {
			g := newGeoUpstream()
			clk := newClock()
			c := newGeoCache(t, "compactcache {\n prefetch 2 10m 10%\n}", g, clk)
			req := geoQuery("s16.geo.", subnet)
			ask(t, c, req, false) // the miss: stored at 0, TTL 300
			clk.advance(100 * time.Second)
			ask(t, c, req, false) // popularity 1
			clk.advance(175 * time.Second)
			ask(t, c, req, false) // popularity 2, 25 s left: prefetched
			await(t, "the prefetch", func() bool { return g.count("s16.geo.") == 2 && !c.refreshes.running() })
			clk.advance(275 * time.Second) // 25 s left of the prefetched entry
			ask(t, c, req, false)          // popularity 3 with the inherited 2: prefetched again
			await(t, "the second prefetch", func() bool { return g.count("s16.geo.") == 3 })
		})
	}
}

// TestVerifyEndsWhenNextPanics: in serve_stale's verify mode the request
// that verifies runs the fetch itself; when the next plugin panics (the
// server recovers) the verify must still end, or the entry counts as being
// verified for good: every later request served stale, none verifying, and
// shutdown waiting for a fetch that is over.
func TestVerifyEndsWhenNextPanics(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h verify\n}", u, clk)
	var panics atomic.Int32
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if u.count("a.example.org.", dns.TypeA) == 1 && panics.Add(1) == 1 {
			panic("the next plugin fails") // the first verify only
		}
		return u.ServeDNS(ctx, w, r)
	})
	req := withEDNS(test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
	ask(t, c, req, false)
	clk.advance(400 * time.Second)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the verify's ServeDNS returned: the next plugin's panic was lost")
			}
		}()
		c.ServeDNS(context.Background(), &recorder{}, req)
	}()
	if c.refreshes.running() {
		t.Error("the verify whose next plugin panicked is still counted as running")
	}
	clk.advance(2 * time.Second) // past the failure recheck
	got := ask(t, c, req, false)
	if _, stale := ede(got); stale || u.count("a.example.org.", dns.TypeA) != 2 {
		t.Errorf("after the panic: stale %v, upstream asked %d times; want the entry verified again", stale, u.count("a.example.org.", dns.TypeA))
	}
}

// TestVerifyAsksOnce: in serve_stale's verify mode a stale entry costs one
// upstream query, whatever the verify brings. Under prefer_positive a
// stale denial verified to a denial (kept beside the answer, so no
// refresh of one) left the request to find the fresh denial and ask again
// as for a miss.
func TestVerifyAsksOnce(t *testing.T) {
	for _, policy := range []string{"", "\n serve_stale_policy prefer_positive"} {
		t.Run(policy, func(t *testing.T) {
			u := exampleUpstream()
			clk := newClock()
			c := parseCache(t, "compactcache {\n serve_stale 1h verify"+policy+"\n}", u, clk)
			req := withEDNS(test.Case{Qname: "missing.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
			ask(t, c, req, false)
			// Another name's miss lands a flight in the list of the name's
			// flights, as happens between two misses of a busy server:
			// the hint that a flight of the name landed last is gone.
			c.ServeDNS(context.Background(), &recorder{}, sameFlightList(t, c, req))
			clk.advance(time.Hour) // stale
			got := ask(t, c, req, false)
			if n := u.count("missing.example.org.", dns.TypeA); n != 2 || got.Rcode != dns.RcodeNameError {
				t.Errorf("verifying a stale denial: rcode %s, upstream asked %d times; want NXDOMAIN, 2", dns.RcodeToString[got.Rcode], n)
			}
		})
	}
}

// sameFlightList returns a query for another name whose flights share a
// list with req's (flights.Flights), which the exampleUpstream answers
// SERVFAIL.
func sameFlightList(t *testing.T, c *Cache, req *dns.Msg) *dns.Msg {
	t.Helper()
	s := new(scratch)
	key := func(m *dns.Msg) uint64 {
		if !s.readMsg(m, &recorder{}, &c.ecs) {
			t.Fatalf("unreadable %v", m)
		}
		return c.flightKey(s)
	}
	want := key(req) % 64
	for i := range 10000 {
		m := withEDNS(test.Case{Qname: fmt.Sprintf("n%d.example.org.", i), Qtype: dns.TypeA}.Msg(), 1232)
		if key(m)%64 == want {
			return m
		}
	}
	t.Fatal("no name found whose flights share a list with the request's")
	return nil
}

// TestFailedRefreshesManyNames: in an outage, each stale name's refresh
// fails and is held back for the failure recheck. With thousands of names
// failing a second, the records of those failures must not make every
// refresh that begins walk all of them under the lock that every stale hit
// takes: that was 16,384 names a second costing about 100 µs a refresh,
// more than the lock has time for.
func TestFailedRefreshesManyNames(t *testing.T) {
	r := newRefreshes()
	const perSecond = 16384
	now := time.Unix(1_800_000_000, 0)
	start := time.Now()
	for i := range 2 * perSecond {
		now = now.Add(time.Second / perSecond)
		h := uint64(i % (perSecond + 100)) // each name again after its recheck
		if r.begin(h, now) {
			r.end(h, now, time.Second, false)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("%d failed refreshes took %v", 2*perSecond, took)
	}
	if n := len(r.inflight); n > 4*perSecond {
		t.Errorf("%d failures held, for %d names failing a second for a second", n, perSecond)
	}
}

// TestWaitersOutliveCanceledLeader: the request that leads a miss's fetch
// may be canceled (a DoH client that went away: CoreDNS hands the chain the
// HTTP request's context, and forward stops asking); the clients that
// waited for its answer are still there and get the answer, not SERVFAIL.
func TestWaitersOutliveCanceledLeader(t *testing.T) {
	u := exampleUpstream()
	release := make(chan struct{})
	c := newTestCache(t, u, newClock())
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		select {
		case <-release:
		case <-ctx.Done(): // as forward gives up
			return dns.RcodeServerFailure, ctx.Err()
		}
		return u.ServeDNS(ctx, w, r)
	})
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ctx, cancel := context.WithCancel(context.Background())
	led := make(chan struct{})
	go func() {
		defer close(led)
		c.ServeDNS(ctx, &recorder{}, req)
	}()
	await(t, "the leader's flight", func() bool { return c.flights.InFlight() == 1 })
	type result struct {
		msg *dns.Msg
		err error
	}
	waited := make(chan result, 1)
	go func() {
		rec := &recorder{}
		_, err := c.ServeDNS(context.Background(), rec, req)
		waited <- result{rec.msg, err}
	}()
	await(t, "the waiter to join", func() bool { _, n := c.flights.Waiting(); return n == 1 })
	cancel()
	<-led
	close(release)
	select {
	case r := <-waited:
		if r.err != nil || r.msg == nil || r.msg.Rcode != dns.RcodeSuccess || len(r.msg.Answer) != 2 {
			t.Errorf("the waiter of a canceled leader got %v, error %v; want the answer", r.msg, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter of a canceled leader got no reply")
	}
}

// shortProofUpstream answers w.example.org A with a signed wildcard's
// answer (TTL 3600) and its proof, NSEC records of the zone's negative TTL
// (300).
func shortProofUpstream(t *testing.T) *upstream {
	u := newUpstream()
	u.add("w.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{
		mustRR(t, "w.example.org. 3600 IN A 192.0.2.1"),
		mustRR(t, "w.example.org. 3600 IN RRSIG A 8 3 3600 20300101000000 20200101000000 12345 example.org. AAAA"),
	}, []dns.RR{
		mustRR(t, "*.example.org. 300 IN NSEC z.example.org. A RRSIG NSEC"),
		mustRR(t, "*.example.org. 300 IN RRSIG NSEC 8 3 300 20300101000000 20200101000000 12345 example.org. AAAA"),
	}, nil)
	return u
}

// TestPrefetchDNSSECShortProof: a signed wildcard answer carries its
// proof, NSEC records whose TTL (the zone's negative TTL) is shorter than
// the answer's, and a DO client's entry lasts as long as that proof. Its
// prefetch must come at PERCENTAGE of that, as the stock cache counts TTL
// left against the TTL it ages: against the answer's TTL, a DO client's
// every hit from the moment it was fetched set off a prefetch, a refresh
// after refresh of one name.
func TestPrefetchDNSSECShortProof(t *testing.T) {
	u := shortProofUpstream(t)
	clk := newClock()
	c := parseCache(t, "compactcache {\n prefetch 1 10m 10%\n}", u, clk)
	req := test.Case{Qname: "w.example.org.", Qtype: dns.TypeA, Do: true}.Msg()
	ask(t, c, req, false)
	for range 10 {
		clk.advance(time.Second)
		if got := ask(t, c, req, false); len(got.Ns) != 2 {
			t.Fatalf("a DO hit without the proof: %v", got)
		}
		await(t, "the prefetch to end", func() bool { return !c.refreshes.running() })
	}
	if n := u.count("w.example.org.", dns.TypeA); n != 1 {
		t.Errorf("10 DO hits within 10 s of 300 fetched the entry %d times, want 1", n)
	}
	clk.advance(270 * time.Second) // 20 s of the proof's 300 left
	ask(t, c, req, false)
	await(t, "the prefetch near the proof's expiry", func() bool { return u.count("w.example.org.", dns.TypeA) == 2 })
}

// TestDOMissPastProofKeepsEntry: a DO client's view of an entry ends with
// its proof (ProofTTL), before the answer's TTL that clients without DO
// still get it for; the DO client's miss then must not replace the entry
// with a failure, as a refresh does not: the SERVFAIL of an upstream that
// times out, cached for the servfail time, was served to every client.
func TestDOMissPastProofKeepsEntry(t *testing.T) {
	u := shortProofUpstream(t)
	clk := newClock()
	c := newTestCache(t, u, clk)
	do := test.Case{Qname: "w.example.org.", Qtype: dns.TypeA, Do: true}.Msg()
	plain := test.Case{Qname: "w.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, do, false)
	clk.advance(400 * time.Second)          // past the proof, 3200 s left of the answer
	u.set("w.example.org.", dns.TypeA, nil) // the upstream fails without a reply, as forward's timeout
	c.ServeDNS(context.Background(), &recorder{}, do)
	if got := ask(t, c, plain, false); got.Rcode != dns.RcodeSuccess || len(got.Answer) != 1 {
		t.Errorf("a client without DO after a DO client's failed miss: %v; want the answer it had", got)
	}
}

// TestECSMissKeepsAnswerWithoutECS: an answer fetched without ECS serves
// no client that sends a subnet (RFC 7871 7.3.1), whose miss fetches its
// own; when that fetch fails, the failure must not replace the answer the
// clients without ECS still get.
func TestECSMissKeepsAnswerWithoutECS(t *testing.T) {
	g := newGeoUpstream()
	clk := newClock()
	c := newGeoCache(t, "compactcache", g, clk)
	ask(t, c, geoQuery("s24.geo.", ""), false)
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		return dns.RcodeServerFailure, context.DeadlineExceeded // as forward's timeout
	})
	c.ServeDNS(context.Background(), &recorder{}, geoQuery("s24.geo.", "10.1.1.0/24"))
	if network, _ := geoAnswer(t, ask(t, c, geoQuery("s24.geo.", ""), false)); network != "none" {
		t.Errorf("a client without ECS got the answer for %s", network)
	}
}

// TestRefreshAnsweredNotStored: a refresh the upstream answers with a valid
// reply that the cache cannot store (records past the per-entry limit) did
// refresh, as the stock cache counts it: verify answers with the reply, not
// the stale entry, and the next stale request refreshes again rather than
// wait out FAILURE_RECHECK, kept for failures.
func TestRefreshAnsweredNotStored(t *testing.T) {
	for _, mode := range []string{"verify", "verify 1m", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			u := exampleUpstream()
			clk := newClock()
			c := parseCache(t, "compactcache {\n serve_stale 1h "+mode+"\n}", u, clk)
			c.MaxEntry = 200
			req := withEDNS(test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
			ask(t, c, req, false)
			var big []dns.RR
			for i := range 40 {
				big = append(big, test.A(fmt.Sprintf("a.example.org. 300 IN A 192.0.2.%d", i+10)))
			}
			u.add("a.example.org.", dns.TypeA, dns.RcodeSuccess, big, nil, nil)
			clk.advance(400 * time.Second)
			for i := 2; i <= 3; i++ {
				got := ask(t, c, req, false)
				if strings.HasPrefix(mode, "verify") && len(got.Answer) != len(big) {
					t.Errorf("request %d: %d records, want the %d the verify brought", i, len(got.Answer), len(big))
				}
				await(t, fmt.Sprintf("refresh %d", i-1), func() bool { return u.count("a.example.org.", dns.TypeA) == i && !c.refreshes.running() })
			}
		})
	}
}

// TestVerifyClientGoneIsNoFailure: a verify whose client went away (a DoH
// client: CoreDNS hands the chain the HTTP request's context) fetched
// nothing, yet the upstream did not fail: the next request verifies again
// rather than getting the stale entry for FAILURE_RECHECK.
func TestVerifyClientGoneIsNoFailure(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h verify\n}", u, clk)
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if err := ctx.Err(); err != nil {
			return dns.RcodeServerFailure, err // as forward gives up
		}
		return u.ServeDNS(ctx, w, r)
	})
	req := withEDNS(test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
	ask(t, c, req, false)
	clk.advance(400 * time.Second)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	c.ServeDNS(gone, &recorder{}, req)
	got := ask(t, c, req, false)
	if _, stale := ede(got); stale || u.count("a.example.org.", dns.TypeA) != 2 {
		t.Errorf("after a verify whose client went away: stale %v, upstream asked %d times; want the entry verified", stale, u.count("a.example.org.", dns.TypeA))
	}
}
