package compactcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// The outage tests run CoreDNS with compactcache in front of forward to an
// upstream that fails: a UDP socket that reads queries and never answers
// (forward times out), or a closed port (the kernel refuses: forward's read
// fails at once). With and without serve_stale they check that
//
//   - clients get a reply within their timeout (5 s): SERVFAIL, or the stale
//     answer with serve_stale;
//   - SERVFAIL is cached for the servfail time: repeat queries within it do
//     not reach forward, the first one after it does;
//   - 50 clients hammering the name for a few seconds make a bounded number of
//     upstream queries per second;
//   - when the upstream answers again, the answer is served fresh after the
//     servfail time, or at the next refresh with serve_stale.
//
// What reaches forward is counted by outagetap, a plugin of this file placed
// right after compactcache; what reaches the upstream socket is counted there
// (health checks, for ".", apart).

const (
	outageClientTimeout = 5 * time.Second
	outageReadTimeout   = 250 * time.Millisecond // forward's read_timeout; it tries twice
	outageServfail      = 2 * time.Second
	outageClients       = 50
	outageHammer        = 3 * time.Second
)

// staleRecheck is the serve_stale line of the scenarios that serve stale:
// a FAILURE_RECHECK of 1 s keeps a refusing upstream from being asked again
// as soon as each refresh fails (see TestOutageStaleDefaultRecheck).
const staleRecheck = "serve_stale 1h immediate 30s 1s"

func TestOutage(t *testing.T) {
	for _, sc := range []struct {
		name, stale string
		maxStale    time.Duration // the slowest a stale answer may be when the upstream is down
	}{
		{"", "", 0},
		// A fetch from the silent upstream takes two read timeouts (500 ms):
		// the stale answer comes sooner.
		{"serve_stale", staleRecheck, 400 * time.Millisecond},
		{"serve_stale_verify", "serve_stale 1h verify 100ms 30s 1s", 450 * time.Millisecond},
	} {
		for _, failure := range []string{"timeout", "refused"} {
			name := failure
			if sc.name != "" {
				name += "/" + sc.name
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				o := newOutage(t, failure, sc.stale)
				if sc.stale == "" {
					o.servfailOutage()
					return
				}
				o.maxStale = sc.maxStale
				o.staleOutage()
			})
		}
	}
}

// TestOutageStaleDefaultRecheck serves stale with serve_stale's defaults in
// front of an upstream that refuses, so that each refresh fails at once.
// Without a FAILURE_RECHECK (the stock cache's default is 0) the next stale
// hit would start another refresh as soon as one failed, one in flight being
// the only bound: 50 clients made about 500 upstream queries a second for one
// name, and in verify mode each stale request verified for itself, one
// upstream query per query. The default recheck keeps both to one a second.
func TestOutageStaleDefaultRecheck(t *testing.T) {
	for _, sc := range []struct{ name, stale string }{
		{"immediate", "serve_stale"},
		{"verify", "serve_stale 1h verify"},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			o := newOutage(t, "refused", sc.stale)
			// How soon it recovers depends on the default a fix chooses;
			// TestOutage checks recovery.
			o.noRecovery = true
			o.staleOutage()
		})
	}
}

// TestOutagePrefetchFailedNotRetried: a popular entry near expiry whose
// prefetch fails (the upstream refuses: forward returns SERVFAIL without a
// reply) is not prefetched again by the next hits at once: the failure
// recheck holds failed prefetches back as it does failed stale refreshes.
// Without it each of 100 hits made its own upstream query.
func TestOutagePrefetchFailedNotRetried(t *testing.T) {
	u := exampleUpstream()
	var down atomic.Bool
	clk := newClock()
	c := parseCache(t, "compactcache {\n prefetch 1 1m 10%\n}", u, clk)
	c.Next = plugin.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if down.Load() {
			u.mu.Lock()
			u.queries[qkey(r.Question[0].Name, r.Question[0].Qtype)]++
			u.mu.Unlock()
			return dns.RcodeServerFailure, fmt.Errorf("connection refused")
		}
		return u.ServeDNS(ctx, w, r)
	})
	req := new(dns.Msg)
	req.SetQuestion("a.example.org.", dns.TypeA)
	ask(t, c, req, false)
	down.Store(true)
	clk.advance(280 * time.Second) // 20 s of 300 left: below 10%
	for range 100 {
		if got := ask(t, c, req, false); got.Rcode != dns.RcodeSuccess || len(got.Answer) != 2 {
			t.Fatalf("hit near expiry: %v", got)
		}
		await(t, "the prefetch to end", func() bool { return !c.refreshes.running() })
	}
	// The miss, then one prefetch: the servfail time (5 s) has not passed.
	if n := u.count("a.example.org.", dns.TypeA); n != 2 {
		t.Errorf("100 hits at one instant near expiry, the upstream refusing: upstream asked %d times, want 2", n)
	}
}

// outage is one scenario: an upstream, the CoreDNS in front of it, the tap
// between compactcache and forward.
type outage struct {
	t       *testing.T
	failure string // "timeout" or "refused"
	up      *outageUpstream
	tap     *outageCounter
	addr    string // CoreDNS, UDP
	qname   string

	maxStale   time.Duration // the slowest a stale answer may be from a silent upstream
	noRecovery bool          // end staleOutage after the hammer
}

// newOutage starts an upstream and CoreDNS in front of it, with the
// compactcache option stale (none if empty).
func newOutage(t *testing.T, failure string, stale string) *outage {
	o := &outage{t: t, failure: failure, up: startOutageUpstream(t), tap: newOutageTap(t)}
	o.qname = strings.ReplaceAll(t.Name(), "/", "-") + ".outage.test."
	o.qname = strings.ToLower(o.qname)
	options := fmt.Sprintf("servfail %s\n\t\tsuccess 10000 3600 1", outageServfail)
	if stale != "" {
		options += "\n\t\t" + stale
	}
	corefile := fmt.Sprintf(`.:0 {
	bind 127.0.0.1
	compactcache {
		%s
	}
	outagetap %s
	forward . %s {
		read_timeout %s
	}
}`, options, o.tap.key, o.up.addr, outageReadTimeout)
	o.addr, _ = startCoreDNS(t, corefile)
	return o
}

// fail makes the upstream fail in the scenario's way.
func (o *outage) fail() {
	if o.failure == "timeout" {
		o.up.setMode(upSilent)
	} else {
		o.up.close()
	}
}

// ask sends one query from a new client and returns the reply and how long
// it took; a missing reply fails the test.
func (o *outage) ask() (*dns.Msg, time.Duration) {
	o.t.Helper()
	c := &dns.Client{Net: "udp", Timeout: outageClientTimeout}
	m := new(dns.Msg)
	m.SetQuestion(o.qname, dns.TypeA)
	m.SetEdns0(1232, false)
	start := time.Now()
	r, _, err := c.Exchange(m, o.addr)
	took := time.Since(start)
	if err != nil {
		o.t.Fatalf("%s: no reply within %v: %v", o.qname, outageClientTimeout, err)
	}
	return r, took
}

// servfailOutage: the upstream fails from the first query on.
func (o *outage) servfailOutage() {
	t := o.t
	o.fail()

	// The first query waits for forward to give up, and gets SERVFAIL.
	r, took := o.ask()
	first := time.Now()
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("first query: rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if o.tap.count(o.qname) != 1 {
		t.Fatalf("first query: forward asked %d times, want 1", o.tap.count(o.qname))
	}
	t.Logf("first query: SERVFAIL after %v; %d packets reached the upstream", took.Round(time.Millisecond), o.up.count(o.qname))

	// Within the servfail time, SERVFAIL comes from the cache, marked as a
	// cached error, and nothing reaches forward; the first query after it
	// goes to forward again.
	packets := o.up.count(o.qname)
	var asked time.Duration
	for deadline := first.Add(outageServfail + 2*time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r, took := o.ask()
		if r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("repeat query: rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
		}
		if o.tap.count(o.qname) > 1 {
			asked = time.Since(first) - took
			break
		}
		if code, ok := ede(r); !ok || code != dns.ExtendedErrorCodeCachedError {
			t.Errorf("repeat query within the servfail time: EDE %d (%v), want %d (Cached Error)", code, ok, dns.ExtendedErrorCodeCachedError)
		}
		if n := o.up.count(o.qname); n != packets {
			t.Fatalf("repeat query within the servfail time: %d packets at the upstream, %d before", n, packets)
		}
	}
	// Entries live whole seconds: a 2 s servfail time lasts between 1 and
	// 2 s from the store, which is a little before the client's reply; and
	// the polling client may be slow to notice. Half a second to a second
	// of slack either side.
	if asked == 0 {
		t.Fatalf("forward not asked again within %v of the first SERVFAIL", outageServfail+2*time.Second)
	}
	if lo, hi := outageServfail-1500*time.Millisecond, outageServfail+time.Second; asked < lo || asked > hi {
		t.Errorf("forward asked again %v after the first SERVFAIL, want within [%v, %v]", asked, lo, hi)
	}
	t.Logf("SERVFAIL cached for %v", asked.Round(time.Millisecond))

	// 50 clients hammer the name: each gets SERVFAIL in time, and forward is
	// asked about once per servfail time.
	h := o.hammer(func(r *dns.Msg) error {
		if r.Rcode != dns.RcodeServerFailure {
			return fmt.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
		}
		return nil
	})
	// One fetch at a time (coalescing), none while the SERVFAIL is cached:
	// at most one per second of the hammer, and one more at its start.
	h.check(t, int(outageHammer/time.Second)+1, 2)

	// The upstream comes back: the answer is served as soon as the cached
	// SERVFAIL expires, and is cached.
	o.recover(60)
	back := time.Now()
	for {
		r, _ := o.ask()
		if r.Rcode == dns.RcodeSuccess {
			if err := o.up.checkAnswer(r, 60); err != nil {
				t.Fatalf("after recovery: %v", err)
			}
			break
		}
		if time.Since(back) > outageServfail+2*time.Second {
			t.Fatalf("%v after the upstream came back: still %s", time.Since(back).Round(time.Millisecond), dns.RcodeToString[r.Rcode])
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("answered %v after the upstream came back", time.Since(back).Round(time.Millisecond))
	fetches := o.tap.count(o.qname)
	for range 5 {
		if r, _ := o.ask(); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("after recovery: %v", r)
		}
	}
	if n := o.tap.count(o.qname); n != fetches {
		t.Errorf("after recovery: %d fetches for 5 queries of a cached answer", n-fetches)
	}
}

// staleOutage: the name is cached, the upstream fails, the entry expires.
func (o *outage) staleOutage() {
	t := o.t
	r, _ := o.ask()
	if err := o.up.checkAnswer(r, 1); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	o.fail()

	// Wait for the entry (TTL 1 s) to expire: the answer is then served
	// stale, at once, with EDE 3 (Stale Answer), and refreshed in the
	// background.
	var took time.Duration
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, took = o.ask()
		if _, ok := ede(r); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stale answer 3 s after a 1 s TTL: %v", r)
		}
	}
	if err := o.up.checkStale(r); err != nil {
		t.Fatalf("first stale answer: %v", err)
	}
	// Only a silent upstream tells whether the stale answer waited for a
	// fetch: a refusing one fails every fetch at once, so the time its stale
	// answer takes is the machine's and not checked.
	if o.failure == "timeout" && took > o.maxStale {
		t.Errorf("stale answer took %v, want at most %v", took, o.maxStale)
	}
	t.Logf("stale answer in %v", took.Round(time.Millisecond))
	time.Sleep(100 * time.Millisecond)
	if n := o.tap.count(o.qname); n != 2 {
		t.Fatalf("after the first stale answer: forward asked %d times, want 2 (the miss and one refresh)", n)
	}

	h := o.hammer(o.up.checkStale)
	// One refresh in flight per entry, and none for a second (the failure
	// recheck time) after one failed.
	h.check(t, int(outageHammer/time.Second)+1, 2)
	if o.noRecovery {
		return
	}

	// The upstream comes back with a new address: the next refresh stores
	// it, and it is served fresh.
	o.recover(60)
	back := time.Now()
	for {
		r, _ := o.ask()
		if _, stale := ede(r); !stale {
			if err := o.up.checkAnswer(r, 60); err != nil {
				t.Fatalf("after recovery: %v", err)
			}
			break
		}
		if err := o.up.checkStale(r); err != nil {
			t.Fatalf("after recovery: %v", err)
		}
		if time.Since(back) > 3*time.Second { // the failure recheck (1 s), a refresh, slack
			t.Fatalf("%v after the upstream came back: still stale", time.Since(back).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("fresh %v after the upstream came back", time.Since(back).Round(time.Millisecond))
}

// recover makes the upstream answer again, with TTL ttl and a new address.
func (o *outage) recover(ttl uint32) {
	o.up.answer(ttl)
	if o.failure == "refused" {
		o.up.reopen()
	} else {
		o.up.setMode(upAnswering)
	}
}

// hammerResult is what the hammering clients saw and the fetches they caused.
type hammerResult struct {
	start, end time.Time
	replies    int64
	slowest    time.Duration
	errs       []string
	fetches    []time.Time // reaching forward, during the hammer
	packets    int         // reaching the upstream socket
}

// hammer runs outageClients clients asking for the name for outageHammer,
// each on its own socket and waiting for each reply, and checks every reply
// with check.
func (o *outage) hammer(check func(*dns.Msg) error) *hammerResult {
	h := &hammerResult{start: time.Now()}
	before, packets := o.tap.count(o.qname), o.up.count(o.qname)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		replies atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(h.errs) < 10 {
			h.errs = append(h.errs, fmt.Sprintf(format, args...))
		}
	}
	end := h.start.Add(outageHammer)
	for i := range outageClients {
		wg.Go(func() {
			conn, err := net.Dial("udp", o.addr)
			if err != nil {
				fail("client %d: %v", i, err)
				return
			}
			defer conn.Close()
			c := &dns.Client{Net: "udp", Timeout: outageClientTimeout}
			dc := &dns.Conn{Conn: conn}
			for n := 0; time.Now().Before(end); n++ {
				m := new(dns.Msg)
				m.SetQuestion(o.qname, dns.TypeA)
				m.SetEdns0(1232, false)
				m.Id = uint16(i<<10 | n&1023)
				start := time.Now()
				r, _, err := c.ExchangeWithConn(m, dc)
				took := time.Since(start)
				if err != nil {
					fail("client %d query %d: no reply after %v: %v", i, n, took.Round(time.Millisecond), err)
					return
				}
				mu.Lock()
				h.slowest = max(h.slowest, took)
				mu.Unlock()
				replies.Add(1)
				if err := check(r); err != nil {
					fail("client %d query %d: %v", i, n, err)
				}
			}
		})
	}
	wg.Wait()
	h.end = time.Now()
	h.replies = replies.Load()
	h.fetches = o.tap.since(o.qname, before)
	h.packets = o.up.count(o.qname) - packets
	return h
}

// check fails the test for the clients' errors, a reply slower than the
// client timeout, and more than total fetches in all or more than
// perSecond in any second.
func (h *hammerResult) check(t *testing.T, total, perSecond int) {
	t.Helper()
	for _, e := range h.errs {
		t.Error(e)
	}
	secs := int(h.end.Sub(h.start)/time.Second) + 1
	buckets := make([]int, secs)
	for _, f := range h.fetches {
		buckets[min(secs-1, int(f.Sub(h.start)/time.Second))]++
	}
	t.Logf("%d clients, %v: %d replies, slowest %v; forward asked %d times (per second: %v), %d packets at the upstream",
		outageClients, h.end.Sub(h.start).Round(time.Millisecond), h.replies, h.slowest.Round(time.Millisecond),
		len(h.fetches), buckets, h.packets)
	if h.slowest > outageClientTimeout {
		t.Errorf("slowest reply took %v, over the client timeout %v", h.slowest, outageClientTimeout)
	}
	if len(h.fetches) > total || slices.Max(buckets) > perSecond {
		t.Errorf("retry storm: forward asked %d times in %v (per second: %v), want at most %d, %d in any second",
			len(h.fetches), h.end.Sub(h.start).Round(time.Millisecond), buckets, total, perSecond)
	}
}

// Upstream modes.
const (
	upAnswering = iota
	upSilent    // reads and drops
)

// outageUpstream is a DNS server on a UDP and a TCP socket of one port that
// can stop answering (it goes on reading, and TCP connections stay open),
// close (the port then refuses) and come back on the same port. It counts
// the queries it receives by lowercased qname. Both transports matter: the
// cache refreshes over TCP, as the stock cache's prefetch does.
type outageUpstream struct {
	t    *testing.T
	addr string

	mu      sync.Mutex
	pc      net.PacketConn
	ln      net.Listener
	conns   map[net.Conn]bool
	mode    int
	ttl     uint32
	version byte // the last octet of the address it answers with
	packets map[string]int
	wg      sync.WaitGroup // the serving goroutines
}

func startOutageUpstream(t *testing.T) *outageUpstream {
	u := &outageUpstream{t: t, ttl: 1, version: 1, packets: map[string]int{}, conns: map[net.Conn]bool{}}
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	// A port below the ephemeral range (32768 and up on Linux): while the
	// upstream is closed, no client socket of the test or of forward can
	// take it, and it reopens on the same port.
	for range 100 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		if pc, err = net.ListenPacket("udp", addr); err != nil {
			continue
		}
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		pc.Close()
	}
	if err != nil {
		t.Fatalf("no port free for both UDP and TCP: %v", err)
	}
	u.addr = pc.LocalAddr().String()
	u.serve(pc, ln)
	t.Cleanup(u.close)
	return u
}

func (u *outageUpstream) serve(pc net.PacketConn, ln net.Listener) {
	u.mu.Lock()
	u.pc, u.ln = pc, ln
	u.mu.Unlock()
	u.wg.Add(2)
	go func() {
		defer u.wg.Done()
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if reply := u.reply(buf[:n]); reply != nil {
				pc.WriteTo(reply, from)
			}
		}
	}()
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns[c] = true
			u.mu.Unlock()
			u.wg.Go(func() {
				defer c.Close()
				dc := &dns.Conn{Conn: c}
				for {
					b, err := dc.ReadMsgHeader(nil)
					if err != nil {
						return
					}
					if reply := u.reply(b); reply != nil {
						dc.Write(reply)
					}
				}
			})
		}
	}()
}

// reply counts the query in b and returns the reply to send, nil for none.
func (u *outageUpstream) reply(b []byte) []byte {
	req := new(dns.Msg)
	if req.Unpack(b) != nil || len(req.Question) != 1 {
		return nil
	}
	q := req.Question[0]
	u.mu.Lock()
	u.packets[strings.ToLower(q.Name)]++
	mode, ttl, version := u.mode, u.ttl, u.version
	u.mu.Unlock()
	if mode == upSilent {
		return nil
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if q.Qtype == dns.TypeA && strings.HasSuffix(q.Name, ".outage.test.") {
		m.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
			A:   net.IPv4(192, 0, 2, version),
		}}
	}
	if o := req.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
	}
	reply, err := m.Pack()
	if err != nil {
		return nil
	}
	return reply
}

func (u *outageUpstream) setMode(mode int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.mode = mode
}

// answer makes the upstream answer with TTL ttl and the next address.
func (u *outageUpstream) answer(ttl uint32) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ttl = ttl
	u.version++
}

// close closes the sockets and connections: the port refuses until reopen.
func (u *outageUpstream) close() {
	u.mu.Lock()
	if u.pc != nil {
		u.pc.Close()
		u.ln.Close()
		u.pc, u.ln = nil, nil
	}
	for c := range u.conns {
		c.Close()
		delete(u.conns, c)
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// reopen listens on the port again, answering.
func (u *outageUpstream) reopen() {
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	for range 100 {
		if pc, err = net.ListenPacket("udp", u.addr); err == nil {
			if ln, err = net.Listen("tcp", u.addr); err == nil {
				break
			}
			pc.Close()
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		u.t.Fatalf("reopening the upstream on %s: %v", u.addr, err)
	}
	u.setMode(upAnswering)
	u.serve(pc, ln)
}

func (u *outageUpstream) count(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.packets[strings.ToLower(name)]
}

// checkAnswer fails unless r is the upstream's current answer with TTL at
// most ttl.
func (u *outageUpstream) checkAnswer(r *dns.Msg, ttl uint32) error {
	u.mu.Lock()
	version := u.version
	u.mu.Unlock()
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		return fmt.Errorf("rcode %s with %d answers, want the answer", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok || !a.A.Equal(net.IPv4(192, 0, 2, version)) || a.Hdr.Ttl > ttl {
		return fmt.Errorf("answer %v, want 192.0.2.%d with TTL at most %d", r.Answer[0], version, ttl)
	}
	if _, ok := ede(r); ok {
		return fmt.Errorf("fresh answer with an EDE: %v", r)
	}
	return nil
}

// checkStale fails unless r is the first answer served stale: its address,
// the stale TTL (30 s) and EDE 3.
func (u *outageUpstream) checkStale(r *dns.Msg) error {
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		return fmt.Errorf("rcode %s with %d answers, want the stale answer", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok || !a.A.Equal(net.IPv4(192, 0, 2, 1)) || a.Hdr.Ttl != 30 {
		return fmt.Errorf("answer %v, want 192.0.2.1 with the stale TTL 30", r.Answer[0])
	}
	if code, ok := ede(r); !ok || code != dns.ExtendedErrorCodeStaleAnswer {
		return fmt.Errorf("EDE %d (%v), want %d (Stale Answer)", code, ok, dns.ExtendedErrorCodeStaleAnswer)
	}
	return nil
}

// outagetap counts the queries compactcache sends to forward.
const outageTapName = "outagetap"

func init() {
	if slices.Contains(dnsserver.Directives, outageTapName) {
		return
	}
	dirs := slices.Clone(dnsserver.Directives)
	if !slices.Contains(dirs, pluginName) {
		dirs = slices.Insert(dirs, slices.Index(dirs, "cache"), pluginName)
	}
	dirs = slices.Insert(dirs, slices.Index(dirs, pluginName)+1, outageTapName)
	if err := dnsserver.SetDirectives(dirs); err != nil {
		panic(err)
	}
	plugin.Register(outageTapName, func(c *caddy.Controller) error {
		c.Next()
		if !c.NextArg() {
			return c.ArgErr()
		}
		outageTaps.Lock()
		counter := outageTaps.m[c.Val()]
		outageTaps.Unlock()
		if counter == nil {
			return c.Errf("no tap %q", c.Val())
		}
		dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
			return outageTap{next: next, counter: counter}
		})
		return nil
	})
}

// outageTaps are the counters of the running tests, by key.
var outageTaps = struct {
	sync.Mutex
	m map[string]*outageCounter
}{m: map[string]*outageCounter{}}

type outageCounter struct {
	key string
	mu  sync.Mutex
	at  map[string][]time.Time // by lowercased qname
}

func newOutageTap(t *testing.T) *outageCounter {
	c := &outageCounter{key: strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), at: map[string][]time.Time{}}
	outageTaps.Lock()
	outageTaps.m[c.key] = c
	outageTaps.Unlock()
	t.Cleanup(func() {
		outageTaps.Lock()
		delete(outageTaps.m, c.key)
		outageTaps.Unlock()
	})
	return c
}

func (c *outageCounter) add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name = strings.ToLower(name)
	c.at[name] = append(c.at[name], time.Now())
}

func (c *outageCounter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.at[strings.ToLower(name)])
}

// since returns the times of the queries for name after the first n.
func (c *outageCounter) since(name string, n int) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.at[strings.ToLower(name)][n:])
}

type outageTap struct {
	next    plugin.Handler
	counter *outageCounter
}

func (o outageTap) Name() string { return outageTapName }

func (o outageTap) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if len(r.Question) == 1 {
		o.counter.add(r.Question[0].Name)
	}
	return plugin.NextOrFailure(o.Name(), o.next, ctx, w, r)
}
