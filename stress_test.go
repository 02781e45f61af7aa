package compactcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestStressMixed runs, from many goroutines at once and for a bounded time,
// everything that touches the store: hits, misses and inserts, evictions (a
// small budget and entry caps), prefetches, stale answers and their
// background refreshes (serve_stale with a fake clock that a goroutine
// advances, failures now and then), SERVFAIL caching, ECS variants (with few
// variants allowed per name) and reloads, which hand the store to a new
// instance (offer and takeOver, as setup's OnRestart and the next instance's
// setup do) or, when the budget changes, start a new one, while the old
// instance still serves and refreshes.
//
// Meant for the race detector (.ci/run runs it under -race). It checks that
// nothing panics, that each request gets one reply (or, when the upstream
// failed on a miss, none and SERVFAIL, for the server to write), well formed
// and answering its question exactly: same ID and question, 0x20 case
// included, the records of the name asked and no other, an ECS answer only
// for a network the client is in; and at the end, the store's invariants
// (checkShards).
//
// COMPACTCACHE_STRESS=30s runs it for longer.
func TestStressMixed(t *testing.T) {
	duration := 2500 * time.Millisecond
	if v := os.Getenv("COMPACTCACHE_STRESS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("COMPACTCACHE_STRESS=%q: want a duration such as 30s", v)
		}
		duration = d
	}
	const clients = 8

	clk := newClock()
	up := &stressUpstream{}
	// Two budgets: a reload between them changes the store's shape.
	corefiles := [2]string{stressCorefile("1MiB"), stressCorefile("2MiB")}
	block := "stress." + strconv.FormatUint(rand.Uint64(), 36) // not another test's handoff

	var (
		active   atomic.Pointer[stressInstance]
		mu       sync.Mutex
		retired  []*stressInstance // instances reloaded away
		errs     atomic.Int64
		fullest  atomic.Int64 // the highest percentage of the budget held
		stop     = make(chan struct{})
		bg       sync.WaitGroup
		reloads  [2]int // handed over, started cold
		shape    = 0
		newCache = func(corefile string) *Cache {
			ctrl := caddy.NewTestController("dns", corefile)
			ctrl.ServerBlockKeys = []string{"."}
			c, err := parse(ctrl)
			if err != nil {
				panic(fmt.Sprintf("%q: %v", corefile, err))
			}
			c.Next, c.now = up, clk.now
			return c
		}
	)
	fail := func(format string, args ...any) {
		if errs.Add(1) <= 20 {
			t.Errorf(format, args...)
		}
	}
	active.Store(&stressInstance{c: newCache(corefiles[0])})

	// The clock: a second every millisecond, and now and then past the
	// serve_stale window, so that entries expire, go stale and go.
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			d := time.Second
			if i%1500 == 1499 {
				d = 2 * time.Hour
			}
			clk.advance(d)
			if s := active.Load().c.Stats(); s.Bytes > s.Capacity {
				fail("the store holds %d bytes, over its budget of %d", s.Bytes, s.Capacity)
			} else {
				fullest.Store(max(fullest.Load(), s.Bytes*100/s.Capacity))
			}
		}
	})
	// Reloads every 20 ms; the one after each third of the run changes the
	// budget.
	bg.Go(func() {
		start := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			old := active.Load()
			old.c.offer(block) // OnRestart
			if third := int(3 * time.Since(start) / duration); third > reloads[1] && third < 3 {
				shape = 1 - shape
			}
			c := newCache(corefiles[shape])
			if c.takeOver(block) {
				reloads[0]++
			} else {
				reloads[1]++
			}
			active.Store(&stressInstance{c: c})
			mu.Lock()
			retired = append(retired, old)
			mu.Unlock()
			// The old instance stops as caddy's Restart stops it: its
			// server waits for the requests in flight (graceful stop),
			// then its OnShutdown runs, while the new instance serves from
			// the same store.
			old.stop()
			withdraw(block, old.c.store)
			old.c.refreshes.shutdown(5 * time.Second)
		}
	})

	var queries, unanswered, stale atomic.Int64
	var clientsWG sync.WaitGroup
	deadline := time.Now().Add(duration)
	for id := range clients {
		clientsWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(id), 7))
			for n := 0; time.Now().Before(deadline) && errs.Load() < 20; n++ {
				q := newStressQuery(rng)
				req := q.msg(rng, uint16(n))
				rec := &recorder{ResponseWriter: test.ResponseWriter{TCP: q.tcp}}
				rcode, err := serveStress(&active, rec, req)
				queries.Add(1)
				switch {
				case rec.writes == 0 && !plugin.ClientWrite(rcode) && rcode == dns.RcodeServerFailure:
					unanswered.Add(1) // the upstream failed on a miss: the server writes SERVFAIL
					continue
				case rec.writes != 1 || rec.msg == nil:
					fail("%s: %d replies written, rcode %d, %v", q, rec.writes, rcode, err)
					continue
				}
				if _, ok := ede(rec.msg); ok {
					stale.Add(1)
				}
				if err := q.check(rec.msg, req); err != nil {
					fail("%s: %v\n%v", q, err, rec.msg)
				}
			}
		})
	}
	clientsWG.Wait()
	close(stop)
	bg.Wait()

	// Shut every instance down, waiting for its background fetches, then
	// check the store they all wrote into.
	mu.Lock()
	all := append(retired, active.Load())
	mu.Unlock()
	for _, inst := range all {
		inst.stop()
		inst.c.refreshes.shutdown(5 * time.Second)
		if inst.c.refreshes.running() {
			t.Errorf("background fetches still running 5 s after shutdown")
		}
	}
	checked := map[*store.Store]bool{}
	for _, inst := range all {
		if !checked[inst.c.store] {
			checked[inst.c.store] = true
			checkShards(t, inst.c.store)
		}
	}
	s := active.Load().c.Stats()
	t.Logf("%v, %d clients: %d queries (%d stale or cached-error replies, %d SERVFAIL left to the server); "+
		"upstream: %d queries, %d of them refreshes; %d reloads handing the store over, %d starting cold; "+
		"%d stores checked; the last at the end: %d entries, %.1f of %.1f MiB, at most %d%% of its budget",
		duration, clients, queries.Load(), stale.Load(), unanswered.Load(),
		up.queries.Load(), up.refreshes.Load(), reloads[0], reloads[1], len(checked), s.Entries, mib(s.Bytes), mib(s.Capacity), fullest.Load())
	if fullest.Load() < 50 {
		t.Errorf("the store never held more than %d%% of its budget: too little load to evict", fullest.Load())
	}
	if up.refreshes.Load() == 0 {
		t.Errorf("no prefetch or stale refresh reached the upstream")
	}
	if reloads[0] == 0 || reloads[1] == 0 {
		t.Errorf("reloads: %d handed the store over, %d started cold; want both", reloads[0], reloads[1])
	}
}

// stressInstance is one instance of the plugin between reloads. Requests
// hold its read lock; stop takes the write lock, and so waits for them, as
// CoreDNS's server waits for the requests in flight before the instance's
// OnShutdown runs.
type stressInstance struct {
	c       *Cache
	mu      sync.RWMutex
	stopped bool
}

func (inst *stressInstance) stop() {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	inst.stopped = true
}

// serveStress serves req with the active instance: the one it loads, or if
// that stopped meanwhile, the next.
func serveStress(active *atomic.Pointer[stressInstance], w dns.ResponseWriter, req *dns.Msg) (int, error) {
	for {
		inst := active.Load()
		inst.mu.RLock()
		if inst.stopped {
			inst.mu.RUnlock()
			continue
		}
		defer inst.mu.RUnlock()
		return inst.c.ServeDNS(context.Background(), w, req)
	}
}

// stressCorefile is the block of TestStressMixed with budget capacity: a TTL
// cap, caps on entries of each kind, prefetch, serve_stale with a recheck
// time, a short servfail time and at most 4 ECS variants per name.
func stressCorefile(capacity string) string {
	return `compactcache 3600 {
	capacity ` + capacity + `
	success 500
	denial 100
	prefetch 2 1m 20%
	serve_stale 1h immediate 10s 5s
	servfail 3s
	ecs 24 56 {
		max_variants 4
	}
}`
}

// Names the stress upstream answers:
//
//	p<i>.stress.test.          A: 1 to 3 addresses 10.<i/256>.<i%256>.<k>; TXT:
//	                           "p<i>" and up to 15 KB more; AAAA: NODATA; every
//	                           17th name NXDOMAIN, every 23rd SERVFAIL
//	g<i>.s<scope>.stress.test. TXT: the network the answer was chosen for,
//	                           as geoUpstream's, with that ECS scope
//
// TTLs vary with the name, from 5 s to a minute; one reply in fifty is a
// SERVFAIL regardless, and one in a hundred comes a millisecond late.
const (
	stressPlain = 8000
	stressHot   = 300
	stressGeo   = 300
)

var stressScopes = [...]uint8{0, 16, 20, 24}

type stressUpstream struct {
	queries, refreshes atomic.Int64
}

func (u *stressUpstream) Name() string { return "stress" }

func (u *stressUpstream) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	u.queries.Add(1)
	if w.RemoteAddr() == coredns.NoClient.RemoteAddr() {
		u.refreshes.Add(1)
	}
	if rand.IntN(100) == 0 {
		select {
		case <-ctx.Done(): // a background fetch of an instance shut down
			return dns.RcodeServerFailure, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	q := r.Question[0]
	kind, i, scope, ok := parseStressName(q.Name)
	if !ok || rand.IntN(50) == 0 || kind == 'p' && i%23 == 0 {
		return dns.RcodeServerFailure, fmt.Errorf("stress upstream: failing %s", q.Name)
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	ttl := uint32(5 + i%56)
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: ttl}
	soa := []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "stress.test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
		Ns: "ns.stress.test.", Mbox: "admin.stress.test.", Serial: 1, Refresh: 7200, Retry: 3600, Expire: 1209600, Minttl: ttl}}
	var echo *dns.EDNS0_SUBNET
	switch {
	case kind == 'g':
		network := "none"
		if e := dnsmsg.Subnet(r); e != nil {
			p, _ := netip.AddrFromSlice(e.Address)
			if e.Family == dnsmsg.FamilyIPv4 {
				p = p.Unmap()
			}
			pfx, _ := p.Prefix(int(min(e.SourceNetmask, scope)))
			network = pfx.String()
			echo = &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: e.Family, SourceNetmask: e.SourceNetmask, SourceScope: scope, Address: e.Address}
		}
		hdr.Rrtype = dns.TypeTXT
		m.Answer = []dns.RR{&dns.TXT{Hdr: hdr, Txt: []string{network}}}
	case i%17 == 0:
		m.Rcode = dns.RcodeNameError
		m.Ns = soa
	case q.Qtype == dns.TypeA:
		for k := range 1 + i%3 {
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IPv4(10, byte(i>>8), byte(i), byte(k+1))})
		}
	case q.Qtype == dns.TypeTXT:
		txt := []string{"p" + strconv.Itoa(i)}
		for range (i * 7) % 61 {
			txt = append(txt, strings.Repeat(string(rune('a'+i%26)), 240))
		}
		m.Answer = []dns.RR{&dns.TXT{Hdr: hdr, Txt: txt}}
	default:
		m.Ns = soa // NODATA
	}
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
		if echo != nil {
			m.IsEdns0().Option = []dns.EDNS0{echo}
		}
	}
	return dns.RcodeSuccess, w.WriteMsg(m)
}

// parseStressName returns the kind ('p' or 'g'), number and ECS scope of a
// stress name, in any case.
func parseStressName(name string) (kind byte, i int, scope uint8, ok bool) {
	labels := dns.SplitDomainName(strings.ToLower(name))
	if len(labels) < 3 || len(labels[0]) < 2 {
		return 0, 0, 0, false
	}
	kind = labels[0][0]
	i, err := strconv.Atoi(labels[0][1:])
	if err != nil {
		return 0, 0, 0, false
	}
	if kind == 'g' {
		s, err := strconv.Atoi(strings.TrimPrefix(labels[1], "s"))
		if err != nil {
			return 0, 0, 0, false
		}
		scope = uint8(s)
	}
	return kind, i, scope, kind == 'p' || kind == 'g'
}

// stressQuery is one client request of the stress test.
type stressQuery struct {
	name  string // as asked, 0x20 case and all
	qtype uint16
	i     int
	geo   bool
	ecs   *netip.Prefix // the client's ECS, nil for none
	edns  bool
	do    bool
	cd    bool
	tcp   bool
}

func (q stressQuery) String() string {
	s := fmt.Sprintf("%s/%s", q.name, dns.TypeToString[q.qtype])
	if q.ecs != nil {
		s += " ecs " + q.ecs.String()
	}
	if q.tcp {
		s += " tcp"
	}
	return s
}

func newStressQuery(rng *rand.Rand) stressQuery {
	q := stressQuery{
		edns: rng.IntN(10) < 7,
		do:   rng.IntN(10) < 3,
		cd:   rng.IntN(20) == 0,
		tcp:  rng.IntN(10) < 3,
	}
	var name string
	switch r := rng.IntN(100); {
	case r < 50: // the hot names: mostly hits
		q.i = rng.IntN(stressHot)
	case r < 80: // all names: misses, inserts, evictions
		q.i = rng.IntN(stressPlain)
	default:
		q.geo = true
	}
	if q.geo {
		q.i = rng.IntN(stressGeo)
		q.qtype = dns.TypeTXT
		name = fmt.Sprintf("g%d.s%d.stress.test.", q.i, stressScopes[q.i%len(stressScopes)])
		q.edns = true
		if rng.IntN(10) < 8 {
			var p netip.Prefix
			if rng.IntN(4) == 0 {
				a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(rng.IntN(4)), byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256)), 15: 1})
				p = netip.PrefixFrom(a, []int{0, 32, 48, 56, 64}[rng.IntN(5)])
			} else {
				a := netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(8)), byte(rng.IntN(256))})
				p = netip.PrefixFrom(a, []int{0, 16, 20, 24, 32}[rng.IntN(5)])
			}
			p = p.Masked()
			q.ecs = &p
		}
	} else {
		q.qtype = []uint16{dns.TypeA, dns.TypeA, dns.TypeA, dns.TypeTXT, dns.TypeAAAA}[rng.IntN(5)]
		name = fmt.Sprintf("p%d.stress.test.", q.i)
	}
	if rng.IntN(2) == 0 { // 0x20
		b := []byte(name)
		for k := range b {
			if b[k] >= 'a' && b[k] <= 'z' && rng.IntN(2) == 0 {
				b[k] -= 'a' - 'A'
			}
		}
		name = string(b)
	}
	q.name = name
	return q
}

func (q stressQuery) msg(rng *rand.Rand, id uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(q.name, q.qtype)
	m.Id = id
	m.CheckingDisabled = q.cd
	if q.edns || q.do {
		m.SetEdns0([]uint16{512, 1232, 4096}[rng.IntN(3)], q.do)
		if q.ecs != nil {
			family := uint16(dnsmsg.FamilyIPv4)
			if q.ecs.Addr().Is6() {
				family = dnsmsg.FamilyIPv6
			}
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{
				Code: dns.EDNS0SUBNET, Family: family, SourceNetmask: uint8(q.ecs.Bits()), Address: net.IP(q.ecs.Addr().AsSlice()),
			})
		}
	}
	return m
}

// check returns what is wrong with reply as the answer to req.
func (q stressQuery) check(reply, req *dns.Msg) error {
	switch {
	case reply.Id != req.Id || !reply.Response:
		return fmt.Errorf("ID %d, response %v; want ID %d, a response", reply.Id, reply.Response, req.Id)
	case len(reply.Question) != 1 || reply.Question[0] != req.Question[0]:
		return fmt.Errorf("question %v, want %v exactly", reply.Question, req.Question[0])
	case reply.Opcode != dns.OpcodeQuery:
		return fmt.Errorf("opcode %d", reply.Opcode)
	}
	if (reply.IsEdns0() != nil) != (req.IsEdns0() != nil) {
		return fmt.Errorf("OPT in the reply %v, in the request %v", reply.IsEdns0() != nil, req.IsEdns0() != nil)
	}
	switch reply.Rcode {
	case dns.RcodeServerFailure:
		return nil
	case dns.RcodeNameError:
		if q.geo || q.i%17 != 0 {
			return fmt.Errorf("NXDOMAIN for a name that exists")
		}
		return checkSOA(reply)
	case dns.RcodeSuccess:
	default:
		return fmt.Errorf("rcode %s", dns.RcodeToString[reply.Rcode])
	}
	if !q.geo && q.i%17 == 0 {
		return fmt.Errorf("NOERROR for a name that does not exist")
	}
	if q.geo {
		return q.checkGeo(reply)
	}
	if q.qtype == dns.TypeAAAA {
		if len(reply.Answer) != 0 {
			return fmt.Errorf("answers to a NODATA question")
		}
		return checkSOA(reply)
	}
	if len(reply.Answer) == 0 && !reply.Truncated {
		return fmt.Errorf("no answer")
	}
	for _, rr := range reply.Answer {
		h := rr.Header()
		if !strings.EqualFold(h.Name, q.name) || h.Rrtype != q.qtype {
			return fmt.Errorf("record %v for another question", rr)
		}
		switch rr := rr.(type) {
		case *dns.A:
			if a := rr.A.To4(); a == nil || a[0] != 10 || int(a[1])<<8|int(a[2]) != q.i&0xffff || a[3] < 1 || int(a[3]) > 1+q.i%3 {
				return fmt.Errorf("address %v is not p%d's", rr.A, q.i)
			}
		case *dns.TXT:
			if len(rr.Txt) == 0 || rr.Txt[0] != "p"+strconv.Itoa(q.i) {
				return fmt.Errorf("TXT %.40q is not p%d's", rr.Txt, q.i)
			}
		}
	}
	return nil
}

// checkGeo checks an ECS answer: for a client that sent ECS, the answer
// for everyone (chosen without ECS) or one chosen for a network that holds
// the client's address and is no longer than the client's prefix (nor the
// configured /24 or /56), and the reply echoes the client's option; without
// ECS, the answer chosen without one.
func (q stressQuery) checkGeo(reply *dns.Msg) error {
	if len(reply.Answer) != 1 {
		return fmt.Errorf("%d answers, want 1", len(reply.Answer))
	}
	txt, ok := reply.Answer[0].(*dns.TXT)
	if !ok || len(txt.Txt) != 1 || !strings.EqualFold(txt.Hdr.Name, q.name) {
		return fmt.Errorf("answer %v", reply.Answer[0])
	}
	network := txt.Txt[0]
	echo := dnsmsg.Subnet(reply)
	if q.ecs == nil {
		if network != "none" || echo != nil {
			return fmt.Errorf("a client without ECS got the answer for %s, ECS %v", network, echo)
		}
		return nil
	}
	// The answer to a query without ECS serves everyone (docs/ecs.md).
	if network != "none" {
		p, err := netip.ParsePrefix(network)
		if err != nil {
			return fmt.Errorf("answer %q", network)
		}
		limit := 24
		if q.ecs.Addr().Is6() {
			limit = 56
		}
		if !p.Contains(q.ecs.Addr()) || p.Bits() > min(q.ecs.Bits(), limit) {
			return fmt.Errorf("a client in %s got the answer for %s", q.ecs, p)
		}
	}
	if echo == nil || int(echo.SourceNetmask) != q.ecs.Bits() || !echo.Address.Equal(net.IP(q.ecs.Addr().AsSlice())) ||
		int(echo.SourceScope) > q.ecs.Bits() && int(echo.SourceScope) != q.ecs.Addr().BitLen() { // past the source: that source only
		return fmt.Errorf("ECS echo %v for the client's %s", echo, q.ecs)
	}
	return nil
}

func checkSOA(reply *dns.Msg) error {
	if len(reply.Ns) != 1 || reply.Ns[0].Header().Rrtype != dns.TypeSOA || !strings.EqualFold(reply.Ns[0].Header().Name, "stress.test.") {
		return fmt.Errorf("authority %v, want the SOA of stress.test.", reply.Ns)
	}
	return nil
}

// TestStressShutdownWhileServing shuts an instance down (its OnShutdown:
// refreshes.shutdown) while requests still reach it, as they can when
// CoreDNS's graceful stop gives up on them after its grace time. Stale hits
// start background refreshes; one that began with the wait group's count at
// zero while shutdown waited in its Wait broke sync.WaitGroup's rule (an Add
// from zero must happen before Wait): the race detector reported it, and
// without it Wait could return with a refresh still to start, or panic. Run
// it under -race.
func TestStressShutdownWhileServing(t *testing.T) {
	for range 20 {
		clk := newClock()
		c := parseCache(t, "compactcache {\n serve_stale 1h immediate\n}", exampleUpstream(), clk)
		req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
		ask(t, c, req, false)
		clk.advance(400 * time.Second) // the entry (TTL 300) is stale
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					c.ServeDNS(context.Background(), &recorder{}, req.Copy())
				}
			})
		}
		time.Sleep(5 * time.Millisecond)
		c.refreshes.shutdown(time.Second)
		close(stop)
		wg.Wait()
	}
}
