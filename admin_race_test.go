package compactcache

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/adminserver"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestAdminFlushRace flushes a zone again and again while clients ask names
// in it and beside it: misses that insert, hits, prefetches and stale
// refreshes (the clock runs fast, TTLs are short). The upstream's answers
// carry an epoch that the test moves on before each flush, as an operator
// flushes because the data changed. After each flush: every entry beside
// the zone that was cached before it is still there, and no entry in the
// zone holds an answer of an epoch before the flush's (a fetch that began
// before the flush stored nothing after it).
func TestAdminFlushRace(t *testing.T) {
	const names = 200
	flushes := 40
	if testing.Short() {
		flushes = 10
	}
	var epoch atomic.Uint32
	var keepAsked atomic.Int64 // upstream queries for the names beside the zone
	next := upstreamFunc(func(r *dns.Msg) *dns.Msg {
		if strings.HasSuffix(r.Question[0].Name, ".keep.example.") {
			keepAsked.Add(1)
		}
		m := new(dns.Msg)
		m.SetReply(r)
		e := epoch.Load() // read when asked: after the flush's epoch moved on
		ip := net.IPv4(10, 0, byte(e>>8), byte(e))
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: ip}}
		return m
	})
	// Walks without rests: the store's ring fills with the entries the
	// refreshes replaced, and a walk of it would rest for seconds under -race.
	defer func(rest time.Duration) { walkRest = rest }(walkRest)
	walkRest = 0
	clk := newClock()
	c := mustParse(t, "compactcache {\n prefetch 1 10m 90%\n serve_stale 1h immediate 0s 0s\n}")
	c.Next, c.now = next, clk.now
	t.Cleanup(func() { c.refreshes.shutdown(5 * time.Second) })

	keep := func(i int) string { return fmt.Sprintf("k%d.keep.example.", i) }
	gone := func(i int) string { return fmt.Sprintf("g%d.flush.example.", i) }
	askName := func(name string) {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		rec := &recorder{ResponseWriter: test.ResponseWriter{}}
		c.ServeDNS(context.Background(), rec, m)
	}
	for i := range names / 2 {
		askName(keep(i))
		askName(gone(i))
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if i := r.IntN(names); r.IntN(2) == 0 {
					askName(keep(i))
				} else {
					askName(gone(i))
				}
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				clk.advance(time.Second)
			}
		}
	})

	zone := mustAdminName(t, "flush.example.")
	var removed int64
	for f := range flushes {
		var before []string
		for i := range names {
			if isCached(t, c, keep(i), dns.TypeA, false) {
				before = append(before, keep(i))
			}
		}
		e := epoch.Add(1)
		removed += c.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{zone}}).Total()
		for _, name := range before {
			if !isCached(t, c, name, dns.TypeA, false) {
				t.Errorf("flush %d: %s was cached before the flush and is not after it", f, name)
			}
		}
		for i := range names {
			if got := epochHeld(t, c, gone(i)); got < e {
				t.Errorf("flush %d (epoch %d): %s holds an answer of epoch %d: stored after the flush by a fetch begun before it", f, e, gone(i), got)
			}
		}
		if t.Failed() {
			break
		}
		time.Sleep(2 * time.Millisecond) // a few fetches for the zone between flushes
	}
	close(stop)
	wg.Wait()
	if removed == 0 {
		t.Error("the flushes removed nothing: the zone was never refilled")
	}
	// Each name beside the zone misses once; the rest are refreshes.
	if n := keepAsked.Load(); n <= names {
		t.Errorf("the upstream was asked %d times for the %d names beside the zone: no prefetch or stale refresh ran", n, names)
	}
	checkShards(t, c.store)
}

// upstreamFunc is a next plugin that answers with what f makes.
type upstreamFunc func(r *dns.Msg) *dns.Msg

func (f upstreamFunc) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	return dns.RcodeSuccess, w.WriteMsg(f(r))
}

func (f upstreamFunc) Name() string { return "upstreamFunc" }

// epochHeld returns the lowest epoch among the answers the cache holds for
// name, the test's upstream answering 10.0.epoch; MaxUint32 for none.
func epochHeld(t *testing.T, c *Cache, name string) uint32 {
	t.Helper()
	lowest := uint32(math.MaxUint32)
	for _, found := range adminserver.Lookup(operator{c}, mustAdminName(t, name), []uint16{dns.TypeA}) {
		if len(found.Answer) != 1 {
			t.Fatalf("%s: %+v", name, found)
		}
		ip := net.ParseIP(found.Answer[0][strings.LastIndexByte(found.Answer[0], '\t')+1:]).To4()
		lowest = min(lowest, uint32(ip[2])<<8|uint32(ip[3]))
	}
	return lowest
}
