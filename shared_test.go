package compactcache

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// These tests run blocks as replicas of one cluster DNS: each a Cache of
// its own in front of one upstream, sharing a real redis-server.

// replicas returns n blocks of the Corefile options in front of u that
// share the tier at r, each with its tier started as a block's startup
// starts it.
func replicas(t *testing.T, r *testenv.Redis, next plugin.Handler, clk *clock, n int, options string) []*Cache {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cs []*Cache
	for range n {
		c := parseCache(t, "compactcache {\n shared redis://"+r.Addr+" {\n secret_file "+secret+"\n timeout 1s\n }\n"+options+"}", newUpstream(), clk)
		c.Next = next
		c.StartShared(t.Name())
		t.Cleanup(c.StopShared)
		for deadline := time.Now().Add(10 * time.Second); !c.shared.Connected(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the tier did not connect")
			}
		}
		cs = append(cs, c)
	}
	return cs
}

// written waits until c's tier has written n entries.
func written(t *testing.T, c *Cache, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); c.shared.Stats().Writes < n; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tier wrote %d entries, want %d", c.shared.Stats().Writes, n)
		}
	}
}

func TestSharedServesWhatAReplicaFetched(t *testing.T) {
	r := testenv.StartRedis(t)
	u, clk := exampleUpstream(), newClock()
	cs := replicas(t, r, u, clk, 3, "")
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	first := ask(t, cs[0], req, false)
	written(t, cs[0], 1)
	for i, c := range cs[1:] {
		got := ask(t, c, req, false)
		if err := sameReply(got, first); err != nil {
			t.Errorf("replica %d: %v", i+1, err)
		}
	}
	if n := u.count("a.example.org.", dns.TypeA); n != 1 {
		t.Errorf("the upstream was asked %d times by 3 replicas, want once", n)
	}
	// The admin stats show the tier.
	if st := (operator{cs[1]}).Stats().Shared; st == nil || st.Hits != 1 || st.Breaker != "closed" || (operator{cs[0]}).Stats().Shared.Writes != 1 {
		t.Errorf("admin stats of the tier: %+v", st)
	}
	// Stored locally: the next ask is a local hit, not a tier lookup.
	lookups := cs[1].shared.Stats().Requests
	ask(t, cs[1], req, false)
	if n := cs[1].shared.Stats().Requests; n != lookups {
		t.Errorf("a second ask asked the tier again (%d lookups, %d before)", n, lookups)
	}
	// The TTL counts from when the entry was stored: 100 s later it says
	// 200 on every replica.
	clk.advance(100 * time.Second)
	if got := ask(t, cs[2], req, false); got.Answer[0].Header().Ttl != 200 {
		t.Errorf("TTL %d 100 s after the fetch, want 200", got.Answer[0].Header().Ttl)
	}
}

// TestSharedDNSSECAndECS: a DO client does not take what a client without
// DO stored, and an ECS answer serves only the clients of its subnet, on
// every replica as on the one that fetched it.
func TestSharedDNSSECAndECS(t *testing.T) {
	r := testenv.StartRedis(t)
	u, clk := signedUpstream(t), newClock()
	cs := replicas(t, r, u, clk, 2, "")
	ask(t, cs[0], doQuery("s.example.", dns.TypeA, false), false)
	written(t, cs[0], 1)
	got := ask(t, cs[1], doQuery("s.example.", dns.TypeA, true), false)
	if !hasType(got, dns.TypeRRSIG) || u.count("s.example.", dns.TypeA) != 2 {
		t.Errorf("a DO client on the other replica: RRSIG %v, upstream asked %d times, want the signed answer fetched", hasType(got, dns.TypeRRSIG), u.count("s.example.", dns.TypeA))
	}

	geo := newGeoUpstream()
	es := replicas(t, r, geo, clk, 2, "")
	const name = "s24.geo."
	inside, outside := ecsQuery(name, "192.0.2.77/32"), ecsQuery(name, "198.51.100.7/32")
	first := ask(t, es[0], ecsQuery(name, "192.0.2.1/32"), false)
	written(t, es[0], 1) // the variant: a name's list is each replica's own
	if got := ask(t, es[1], inside, false); geo.count(name) != 1 || got.Answer[0].String() != first.Answer[0].String() {
		t.Errorf("a client of the same /24 on the other replica: %v, upstream asked %d times", got.Answer, geo.count(name))
	}
	if got := ask(t, es[1], outside, false); geo.count(name) != 2 || got.Answer[0].String() == first.Answer[0].String() {
		t.Errorf("a client of another subnet: %v, upstream asked %d times, want it asked for its own answer", got.Answer, geo.count(name))
	}
}

// TestSharedFlushReachesReplicas: one flush through one replica drops the
// name from the tier and from every replica's store within a second.
func TestSharedFlushReachesReplicas(t *testing.T) {
	r := testenv.StartRedis(t)
	u, clk := exampleUpstream(), newClock()
	cs := replicas(t, r, u, clk, 3, "")
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, cs[0], req, false)
	written(t, cs[0], 1)
	for _, c := range cs[1:] {
		ask(t, c, req, false)
	}
	// The data changes, and the operator flushes it through one replica
	// while another serves it.
	u.add("a.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("a.example.org. 300 IN A 192.0.2.99")}, nil, nil)
	stop, served := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				served <- nil
				return
			default:
			}
			rec := &recorder{ResponseWriter: test.ResponseWriter{}}
			if _, err := cs[2].ServeDNS(context.Background(), rec, req.Copy()); err != nil || rec.msg == nil || rec.msg.Rcode != dns.RcodeSuccess || len(rec.msg.Answer) == 0 {
				served <- fmt.Errorf("a replica answered %v (%v) during the flush", rec.msg, err)
				return
			}
		}
	}()
	name := mustAdminName(t, "a.example.org")
	if n, err := (operator{cs[1]}).Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{name}}); n != (admin.Counts{Success: 1}) || err != nil {
		t.Fatalf("the flush removed %+v locally (%v)", n, err)
	}
	flushed := time.Now()
	for _, c := range cs {
		for {
			m := ask(t, c, req, false)
			if len(m.Answer) == 1 && strings.HasSuffix(m.Answer[0].String(), "192.0.2.99") {
				break
			}
			if time.Since(flushed) > time.Second {
				t.Fatalf("a replica answers %v a second after the flush", m.Answer)
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(stop)
	if err := <-served; err != nil {
		t.Error(err)
	}
}

// TestSharedFaults: a tier that holds forged values, or is down, never
// makes a replica answer wrong or SERVFAIL: it asks the upstream.
func TestSharedFaults(t *testing.T) {
	r := testenv.StartRedis(t)
	u, clk := exampleUpstream(), newClock()
	cs := replicas(t, r, u, clk, 2, "")
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	want := ask(t, cs[0], req, false)
	written(t, cs[0], 1)
	keys := entryKeys(t, r)
	if len(keys) == 0 {
		t.Fatal("no entry key in the tier")
	}
	// Every value overwritten: the other replica refuses them and asks the
	// upstream.
	for _, k := range keys {
		r.MustDo("SET", k, "forged")
	}
	got := ask(t, cs[1], req, false)
	if err := sameReply(got, want); err != nil || u.count("a.example.org.", dns.TypeA) != 2 || cs[1].shared.Stats().Rejected == 0 {
		t.Errorf("with a forged value: %v, upstream asked %d times, rejected %d", err, u.count("a.example.org.", dns.TypeA), cs[1].shared.Stats().Rejected)
	}
	// Down: answered from the upstream within the timeout's reach.
	r.Kill()
	other := test.Case{Qname: "a.example.org.", Qtype: dns.TypeAAAA}.Msg()
	start := time.Now()
	if got := ask(t, cs[1], other, false); got.Rcode != dns.RcodeSuccess || len(got.Answer) != 1 {
		t.Errorf("with the tier down: %v", got)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("with the tier down the answer took %v", d)
	}
	// A flush with the tier down is applied to the store, and the operator
	// told that it reached neither the tier nor the other replicas.
	name := mustAdminName(t, "a.example.org")
	if n, err := (operator{cs[1]}).Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{name}}); n.Total() != 2 || err == nil || !strings.Contains(err.Error(), "not applied to the shared tier") {
		t.Errorf("a flush with the tier down removed %+v, error %v", n, err)
	}
}

// TestSharedFlushFencesFirst: a fetch that began before a flush and ends
// while the flush is written to the tier stores nothing the flush covers:
// not in the store, and not in the tier, where its stored time could fall
// after the flush's epoch and serve every replica the answer flushed.
func TestSharedFlushFencesFirst(t *testing.T) {
	r := testenv.StartRedis(t)
	u, clk := exampleUpstream(), newClock()
	cs := replicas(t, r, u, clk, 1, "")
	started, release := u.hold("slow.example.org. 300 IN A 192.0.2.7")
	asked := make(chan struct{})
	go func() {
		defer close(asked)
		ask(t, cs[0], test.Case{Qname: "slow.example.org.", Qtype: dns.TypeA}.Msg(), false)
	}()
	<-started
	// The tier takes the flush's epoch only once the pause ends.
	r.MustDo("CLIENT", "PAUSE", "500", "WRITE")
	flushed := make(chan error, 1)
	go func() {
		_, err := (operator{cs[0]}).Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "slow.example.org")}})
		flushed <- err
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	<-asked
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // what the writer would write, written
	if keys, st := entryKeys(t, r), cs[0].shared.Stats(); len(keys) != 0 || st.Writes != 0 {
		t.Errorf("the fetch that ended during the flush wrote %d entries to the tier (%d keys)", st.Writes, len(keys))
	}
	if n := (operator{cs[0]}).Stats().Entries; n.Total() != 0 {
		t.Errorf("the store holds %+v after the flush", n)
	}
}

// entryKeys returns the tier's keys of entries: those with a slot.
func entryKeys(t *testing.T, r *testenv.Redis) []string {
	t.Helper()
	return strings.Fields(r.MustDo("KEYS", "cc:*{*}*"))
}

// ecsQuery asks name TXT with the ECS option of prefix.
func ecsQuery(name, prefix string) *dns.Msg {
	m := test.Case{Qname: name, Qtype: dns.TypeTXT}.Msg()
	_, n, _ := net.ParseCIDR(prefix)
	ones, _ := n.Mask.Size()
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: dnsmsg.FamilyIPv4, SourceNetmask: uint8(ones), Address: n.IP.To4()}}
	return m
}

// TestSharedPortsApart: blocks of one Corefile on other ports, of the same
// settings and tier, forward each to an upstream of its own: the answer
// one fetched is never served by another.
func TestSharedPortsApart(t *testing.T) {
	r := testenv.StartRedis(t)
	var corefile string
	var addrs []string
	for i := range 2 {
		u := newUpstream()
		u.add("a.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(fmt.Sprintf("a.example.org. 300 IN A 192.0.2.%d", i+1))}, nil, nil)
		for j := range 100 {
			u.add(fmt.Sprintf("w%d.example.org.", j), dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(fmt.Sprintf("w%d.example.org. 300 IN A 192.0.2.9", j))}, nil, nil)
		}
		port := testenv.FreePort(t)
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
		corefile += fmt.Sprintf(".:%d {\n\tbind 127.0.0.1\n\tcompactcache {\n\t\tshared redis://%s\n\t}\n\tforward . %s\n}\n", port, r.Addr, startUpstream(t, u))
	}
	inst, err := startCorefile(corefile)
	if err != nil {
		t.Fatal(err)
	}
	defer stopInstance(inst)
	// An answer the block wrote to the tier: its tier is connected.
	n := 0
	writes := func(addr, name string) {
		for before, deadline := len(entryKeys(t, r)), time.Now().Add(10*time.Second); len(entryKeys(t, r)) == before; n++ {
			if time.Now().After(deadline) {
				t.Fatalf("%s never wrote to the tier", addr)
			}
			q := name
			if q == "" {
				q = fmt.Sprintf("w%d.example.org.", n)
			}
			exchangeUDP(t, addr, test.Case{Qname: q, Qtype: dns.TypeA}.Msg())
			time.Sleep(20 * time.Millisecond)
		}
	}
	writes(addrs[1], "")
	writes(addrs[0], "")
	writes(addrs[0], "a.example.org.")
	got, _ := exchangeUDP(t, addrs[1], test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())
	if len(got.Answer) != 1 || got.Answer[0].(*dns.A).A.String() != "192.0.2.2" {
		t.Errorf("the block on %s answered %v, want its own upstream's 192.0.2.2", addrs[1], got.Answer)
	}
}

// TestSharedStaleCounted: an answer from the tier, stale or fresh, is a
// miss of the block's cache (its lookup missed) and a hit of the tier's: a
// stale one is not counted in served_stale_total, which counts the stale
// hits of the block's own store, so that it never exceeds hits_total.
func TestSharedStaleCounted(t *testing.T) {
	r := testenv.StartRedis(t)
	u, clk := exampleUpstream(), newClock()
	cs := replicas(t, r, u, clk, 2, " serve_stale 1h\n")
	// Labels of the test's own, set before the block's first request, so
	// that the series read count this block's requests alone.
	cs[1].metrics.Zones = "shared-stale-counted.test."
	series := func(family string) float64 {
		return seriesValue(t, "coredns_cache_"+family, map[string]string{"zones": cs[1].metrics.Zones, "type": "success"})
	}
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	ask(t, cs[0], req, false)
	written(t, cs[0], 1)
	clk.advance(310 * time.Second) // expired 10 s ago: stale, within serve_stale
	if got := ask(t, cs[1], req, false); got.Rcode != dns.RcodeSuccess || len(got.Answer) != 2 {
		t.Fatalf("the stale answer from the tier: %v", got)
	}
	if st := cs[1].shared.Stats(); st.Hits != 1 {
		t.Errorf("the tier's stats after its stale answer: %+v, want a hit", st)
	}
	if req, hits, misses, stale := series("requests_total"), series("hits_total"), series("misses_total"), series("served_stale_total"); req != 1 || hits != 0 || misses != 1 || stale != 0 {
		t.Errorf("a stale answer from the tier counted requests %v, hits %v, misses %v, served stale %v; want 1, 0, 1, 0", req, hits, misses, stale)
	}
}
