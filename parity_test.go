package compactcache

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// await polls cond until it holds, for at most two seconds: background
// refreshes finish on their own goroutines.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func ede(m *dns.Msg) (uint16, bool) {
	if o := m.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_EDE); ok {
				return e.InfoCode, true
			}
		}
	}
	return 0, false
}

func parseCache(t *testing.T, corefile string, u *upstream, clk *clock) *Cache {
	t.Helper()
	c := newTestCache(t, u, clk)
	parsed := mustParse(t, corefile)
	parsed.Next, parsed.now = c.Next, c.now
	t.Cleanup(func() { parsed.refreshes.shutdown(time.Second) })
	return parsed
}

func TestPrefetch(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n prefetch 1 1m 10%\n}", u, clk)
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)
	clk.advance(250 * time.Second) // 50 s left: above 10% of 300
	ask(t, c, req, false)
	if n := u.count("a.example.org.", dns.TypeA); n != 1 {
		t.Fatalf("prefetched at 50 s left: upstream asked %d times", n)
	}
	clk.advance(25 * time.Second) // 25 s left: below 10%
	ask(t, c, req, false)
	await(t, "the prefetch", func() bool { return u.count("a.example.org.", dns.TypeA) == 2 })
	clk.advance(60 * time.Second) // the old entry would have expired
	got := ask(t, c, req, false)
	if n := u.count("a.example.org.", dns.TypeA); n != 2 || got.Answer[0].Header().Ttl != 240 {
		t.Fatalf("after the prefetch: upstream asked %d times, TTL %d; want 2 and 240", n, got.Answer[0].Header().Ttl)
	}
}

func TestServeStaleImmediate(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h immediate 30s 1m\n}", u, clk)
	req := withEDNS(test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
	ask(t, c, req, false)

	// Expired, the upstream failing: the stale answer, with EDE 3 and the
	// response TTL, and one refresh.
	working := u.script("a.example.org.", dns.TypeA)
	u.add("a.example.org.", dns.TypeA, dns.RcodeServerFailure, nil, nil, nil)
	clk.advance(400 * time.Second)
	got := ask(t, c, req, false)
	if code, ok := ede(got); !ok || code != edeStaleAnswer || got.Rcode != dns.RcodeSuccess || got.Answer[0].Header().Ttl != 30 {
		t.Fatalf("stale reply: rcode %d, EDE %d (%v), TTL %d; want NOERROR, EDE 3, TTL 30", got.Rcode, code, ok, got.Answer[0].Header().Ttl)
	}
	await(t, "the refresh", func() bool { return u.count("a.example.org.", dns.TypeA) == 2 })
	await(t, "the refresh to end", func() bool { return !c.refreshes.running() })
	// The failed refresh left the entry; the recheck time holds the next.
	ask(t, c, req, false)
	clk.advance(30 * time.Second)
	ask(t, c, req, false)
	if n := u.count("a.example.org.", dns.TypeA); n != 2 {
		t.Fatalf("upstream asked %d times within the failure recheck, want 2", n)
	}

	// After the recheck time, a refresh that works replaces the entry.
	u.set("a.example.org.", dns.TypeA, working)
	clk.advance(31 * time.Second)
	ask(t, c, req, false)
	await(t, "the second refresh", func() bool { return u.count("a.example.org.", dns.TypeA) == 3 })
	await(t, "the fresh entry", func() bool {
		_, stale := ede(ask(t, c, req, false))
		return !stale
	})

	// Beyond the serve_stale window: a miss.
	clk.advance(2 * time.Hour)
	ask(t, c, req, false)
	if n := u.count("a.example.org.", dns.TypeA); n != 4 {
		t.Fatalf("upstream asked %d times beyond the stale window, want 4", n)
	}
}

func TestServeStaleVerify(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h verify\n}", u, clk)
	req := withEDNS(test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
	ask(t, c, req, false)

	// Expired, the upstream has a new answer: the request gets it.
	u.add("a.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("a.example.org. 300 IN A 192.0.2.99")}, nil, nil)
	clk.advance(400 * time.Second)
	got := ask(t, c, req, false)
	if _, stale := ede(got); stale || got.Answer[0].(*dns.A).A.String() != "192.0.2.99" {
		t.Fatalf("verify: got %v, want the refreshed answer without EDE", got.Answer)
	}

	// Expired, the upstream failing: the stale answer.
	u.add("a.example.org.", dns.TypeA, dns.RcodeServerFailure, nil, nil, nil)
	clk.advance(400 * time.Second)
	got = ask(t, c, req, false)
	if code, _ := ede(got); code != edeStaleAnswer || got.Rcode != dns.RcodeSuccess {
		t.Fatalf("verify with the upstream failing: rcode %d EDE %d, want the stale answer with EDE 3", got.Rcode, code)
	}
}

func TestStaleNXDOMAINAndCachedError(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale\n}", u, clk)
	req := withEDNS(test.Case{Qname: "missing.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
	ask(t, c, req, false)
	clk.advance(time.Hour)
	if code, _ := ede(ask(t, c, req, false)); code != edeStaleNXDomain {
		t.Fatalf("stale NXDOMAIN: EDE %d, want 19", code)
	}

	fail := withEDNS(test.Case{Qname: "down.example.org.", Qtype: dns.TypeA}.Msg(), 1232)
	c.ServeDNS(context.Background(), &recorder{}, fail)
	got := ask(t, c, fail, false)
	if code, _ := ede(got); got.Rcode != dns.RcodeServerFailure || code != edeCachedError {
		t.Fatalf("cached SERVFAIL: rcode %d EDE %d, want SERVFAIL with EDE 13", got.Rcode, code)
	}
}

func TestPreferPositive(t *testing.T) {
	u := exampleUpstream()
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h verify\n serve_stale_policy prefer_positive\n}", u, clk)
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)

	// The name is gone upstream: the denial is stored beside the answer,
	// and the stale answer keeps being served.
	soa := []dns.RR{test.SOA("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60")}
	u.add("a.example.org.", dns.TypeA, dns.RcodeNameError, nil, soa, nil)
	clk.advance(400 * time.Second)
	for range 2 {
		if got := ask(t, c, req, false); got.Rcode != dns.RcodeSuccess || len(got.Answer) != 2 {
			t.Fatalf("prefer_positive: rcode %d with %d answers, want the stale answer", got.Rcode, len(got.Answer))
		}
	}
	if c.Stats().Entries != 2 {
		t.Fatalf("%d entries, want the answer and the denial beside it", c.Stats().Entries)
	}
	// Once the answer is beyond the stale window, the denial is served.
	clk.advance(time.Hour)
	if got := ask(t, c, req, false); got.Rcode != dns.RcodeNameError {
		t.Fatalf("beyond the stale window: rcode %d, want NXDOMAIN", got.Rcode)
	}
}

func TestDisable(t *testing.T) {
	u := exampleUpstream()
	c := parseCache(t, "compactcache {\n disable success example.org\n}", u, newClock())
	a := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	nx := test.Case{Qname: "missing.example.org.", Qtype: dns.TypeA}.Msg()
	for range 2 {
		ask(t, c, a, false)
		ask(t, c, nx, false)
	}
	if n, m := u.count("a.example.org.", dns.TypeA), u.count("missing.example.org.", dns.TypeA); n != 2 || m != 1 {
		t.Fatalf("upstream asked %d times for the success, %d for the denial; want 2 and 1", n, m)
	}
}

func TestZonesAndBypass(t *testing.T) {
	u := exampleUpstream()
	c := parseCache(t, "compactcache example.net", u, newClock())
	a := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, a, false)
	ask(t, c, a, false)
	if n := u.count("a.example.org.", dns.TypeA); n != 2 {
		t.Fatalf("outside the zones: upstream asked %d times, want 2", n)
	}
	c = parseCache(t, "compactcache", u, newClock())
	c.plan.bypass = dnsmsg.NewZoneSet([]string{"example.org."})
	ask(t, c, a, false)
	if n := u.count("a.example.org.", dns.TypeA); n != 3 || c.Stats().Entries != 0 {
		t.Fatalf("bypassed zone: upstream asked %d times, %d entries; want 3 and 0", n, c.Stats().Entries)
	}
}

func TestShutdownEndsBackgroundFetches(t *testing.T) {
	clk := newClock()
	c := parseCache(t, "compactcache {\n prefetch 1 1m 90%\n}", exampleUpstream(), clk)
	var blocked atomic.Int32
	answering := c.Next
	c.Next = test.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if w.RemoteAddr() == coredns.NoClient.RemoteAddr() {
			blocked.Add(1)
			<-ctx.Done()
			return dns.RcodeServerFailure, ctx.Err()
		}
		return answering.ServeDNS(ctx, w, r)
	})
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, c, req, false)
	clk.advance(100 * time.Second)
	ask(t, c, req, false)
	await(t, "the prefetch to start", func() bool { return blocked.Load() == 1 })
	start := time.Now()
	c.refreshes.shutdown(5 * time.Second)
	if c.refreshes.running() || time.Since(start) > time.Second {
		t.Fatalf("shutdown took %v and left a fetch running", time.Since(start))
	}
}
