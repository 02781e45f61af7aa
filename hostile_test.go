package compactcache

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/core/dnsserver"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// Hostile upstream replies. Each row scripts what the next plugin answers
// and says what the cache makes of it: what it stores (entries after the
// first query, upstream queries after two client queries), which counter
// counts it, the debug line it logs, and what the client gets.

// hostileNext is the scripted next plugin of a row: answer makes the reply,
// written with WriteMsg, or raw makes bytes written with Write.
type hostileNext struct {
	mu     sync.Mutex
	asked  map[string]int // by lowercased name
	last   *dns.Msg       // the last reply written with WriteMsg
	answer func(r *dns.Msg) *dns.Msg
	raw    func(r *dns.Msg) []byte
}

func (h *hostileNext) Name() string { return "hostile" }

func (h *hostileNext) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	h.mu.Lock()
	h.asked[strings.ToLower(r.Question[0].Name)]++
	h.mu.Unlock()
	if h.raw != nil {
		_, err := w.Write(h.raw(r))
		return dns.RcodeSuccess, err
	}
	m := h.answer(r)
	h.mu.Lock()
	h.last = m
	h.mu.Unlock()
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func (h *hostileNext) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.asked[strings.ToLower(name)]
}

// hostileReply is the reply to r with rcode and sections, and the OPT a
// server echoes.
func hostileReply(r *dns.Msg, rcode int, answer, ns, extra []dns.RR) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(r, rcode)
	m.Authoritative, m.RecursionAvailable = true, true
	m.Answer, m.Ns, m.Extra = answer, ns, extra
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
	}
	return m
}

// hostileRun is one row's cache and upstream, and the client's view.
type hostileRun struct {
	c    *Cache
	clk  *clock
	next *hostileNext
	ctx  context.Context
}

// ask sends req as a client over UDP or TCP. It returns what the client got
// (nil for nothing), the panic ServeDNS raised, if any, and its error; a
// query that does not return within five seconds (a shard lock left held)
// fails the test.
func (h *hostileRun) ask(t *testing.T, req *dns.Msg, tcp bool) (got *dns.Msg, panicked any, err error) {
	t.Helper()
	rec := &recorder{ResponseWriter: test.ResponseWriter{TCP: tcp}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { panicked = recover() }()
		_, err = h.c.ServeDNS(h.ctx, rec, req.Copy())
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("ServeDNS(%v) did not return: deadlock", req.Question[0])
	}
	return rec.msg, panicked, err
}

// hostileServer names a row's server in the metrics' server label, so that
// its counters are its own: metrics.WithServer reads the server's address
// from the context.
func hostileServer(row string) context.Context {
	return context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: "hostile://" + row})
}

// counters are a row's drops and refused counts, read from the plugin's
// families with the labels a Cache made by New has: the row's server, and
// empty zones and view.
func counters(t *testing.T, ctx context.Context) (drops, refused float64) {
	labels := map[string]string{"server": ctx.Value(dnsserver.Key{}).(*dnsserver.Server).Addr, "zones": "", "view": ""}
	return seriesValue(t, "coredns_compactcache_drops_total", labels), seriesValue(t, "coredns_compactcache_refused_total", labels)
}

// debugLog turns CoreDNS debug logging on and captures the standard logger
// (captureLog) until the test ends.
func debugLog(t *testing.T) *testenv.LogBuffer {
	wasOn := clog.D.Value()
	clog.D.Set()
	t.Cleanup(func() {
		if !wasOn {
			clog.D.Clear()
		}
	})
	return testenv.CaptureLog(t)
}

const debugPrefix = "[DEBUG] plugin/" + pluginName + ": "

func txtRecords(name string, n, size int) []dns.RR {
	var rrs []dns.RR
	for i := range n {
		s := strings.Repeat(string(rune('a'+i%26)), size)
		rrs = append(rrs, &dns.TXT{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300}, Txt: []string{s}})
	}
	return rrs
}

// exactSizeReply is a reply to r of TXT records at the qname that packs,
// uncompressed, to exactly size bytes.
func exactSizeReply(t *testing.T, r *dns.Msg, size int) *dns.Msg {
	m := hostileReply(r, dns.RcodeSuccess, nil, nil, nil)
	m.Compress = false
	name := r.Question[0].Name
	for {
		rr := txtRecords(name, 1, 255)[0]
		m.Answer = append(m.Answer, rr)
		if m.Len() > size {
			m.Answer = m.Answer[:len(m.Answer)-1]
			break
		}
	}
	// Fill what is missing with one more record, dropping a whole one
	// first when less is missing than a record with an empty string takes.
	empty := m.Len()
	m.Answer = append(m.Answer, txtRecords(name, 1, 0)...)
	empty, m.Answer = m.Len()-empty, m.Answer[:len(m.Answer)-1]
	for m.Len() != size {
		missing := size - m.Len()
		switch {
		case missing < empty:
			m.Answer = m.Answer[:len(m.Answer)-1]
		case missing-empty > 255:
			m.Answer = append(m.Answer, txtRecords(name, 1, 255)...)
		default:
			m.Answer = append(m.Answer, txtRecords(name, 1, missing-empty)...)
		}
	}
	return m
}

// entryRecordsLen is the size of m's records in an entry for a question of
// qname, qtype and qclass, as builder.appendRecord lays them out: what the
// per-entry limit bounds.
func entryRecordsLen(t *testing.T, m *dns.Msg, qname string, qtype, qclass uint16) int {
	t.Helper()
	var name [dnsmsg.MaxNameLen]byte
	n, err := dns.PackDomainName(qname, name[:], 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for _, rrs := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range rrs {
			buf := make([]byte, dns.MaxMsgSize)
			end, err := dns.PackRR(dns.Copy(rr), buf, 0, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			r, _ := entry.WireRecord(buf[:end], 0)
			if entry.HopByHop(r.Type) {
				continue
			}
			size += 1 + 4 + 2 + len(r.Rdata)
			if !dnsmsg.EqualFoldWire(r.Owner, name[:n]) {
				size += len(r.Owner)
			}
			if r.Type != qtype {
				size += 2
			}
			if r.Class != qclass {
				size += 2
			}
		}
	}
	return size
}

// longName is a name of 255 bytes in wire form, the longest there is.
var longName = strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61) + "."

// hostileRow is one hostile upstream reply and what the cache does with it.
type hostileRow struct {
	name  string
	qname string // q.example.org. when empty
	qtype uint16 // A when 0
	tcp   bool   // the client asks over TCP
	ecs   *dns.EDNS0_SUBNET
	setup func(c *Cache)

	answer func(t *testing.T, r *dns.Msg) *dns.Msg // written with WriteMsg
	raw    func(t *testing.T, r *dns.Msg) []byte   // written with Write instead

	entries        int64   // stored after the first query
	asks           int     // upstream queries after two client queries
	drops, refused float64 // counted over the two queries
	log            string  // in the debug log; "" when there is no debug line
	noReply        bool    // the client gets nothing and ServeDNS an error
	check          func(t *testing.T, h *hostileRun, first, second *dns.Msg)
}

func hostileRows() []hostileRow {
	a := func(name string) dns.RR { return test.A(name + " 300 IN A 192.0.2.1") }
	soa := test.SOA("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60")
	withRcode := func(rcode int) func(*testing.T, *dns.Msg) *dns.Msg {
		return func(_ *testing.T, r *dns.Msg) *dns.Msg { return hostileReply(r, rcode, nil, nil, nil) }
	}
	answers := func(t *testing.T, m *dns.Msg, want int) {
		t.Helper()
		if m == nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != want {
			t.Fatalf("client got %v, want NOERROR with %d answers", m, want)
		}
	}
	// servfails checks that the client got SERVFAIL, to its own question,
	// both times: what the cache answers in place of a reply it cannot
	// pass on.
	servfails := func(t *testing.T, _ *hostileRun, first, second *dns.Msg) {
		t.Helper()
		for _, m := range []*dns.Msg{first, second} {
			if m == nil || m.Rcode != dns.RcodeServerFailure || len(m.Answer)+len(m.Ns) != 0 {
				t.Fatalf("client got %v, want SERVFAIL without records", m)
			}
		}
	}
	return []hostileRow{
		{
			name: "question mismatch: another name",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("evil.example.org.")}, nil, nil)
				m.Question[0].Name = "evil.example.org."
				return m
			},
			asks: 2, drops: 2, log: "question does not match the request",
			// Not stored, nor passed on: the client gets SERVFAIL, as from
			// Unbound (forward never writes such a reply: it turns it into
			// FORMERR).
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				servfails(t, h, first, second)
				if n := h.next.count("evil.example.org."); n != 0 {
					t.Fatalf("evil.example.org. asked %d times", n)
				}
				// The mismatched answer is not served for the name it names.
				got, _, _ := h.ask(t, test.Case{Qname: "evil.example.org.", Qtype: dns.TypeA}.Msg(), false)
				if n := h.next.count("evil.example.org."); n != 1 || got == nil {
					t.Fatalf("evil.example.org. asked %d times after a query for it, want 1 (nothing cached for it)", n)
				}
			},
		},
		{
			name: "question mismatch: another type",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{test.AAAA("q.example.org. 300 IN AAAA 2001:db8::1")}, nil, nil)
				m.Question[0].Qtype = dns.TypeAAAA
				return m
			},
			asks: 2, drops: 2, log: "question does not match the request", check: servfails,
		},
		{
			name: "question missing",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org.")}, nil, nil)
				m.Question = nil
				return m
			},
			asks: 2, drops: 2, log: "question does not match the request", check: servfails,
		},
		{
			name: "changed qname case",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("Q.EXAMPLE.ORG.")}, nil, nil)
				m.Question[0].Name = "Q.EXAMPLE.ORG."
				return m
			},
			// The same question (RFC 4343): stored, and the client sees its
			// own case.
			entries: 1, asks: 1,
			check: func(t *testing.T, _ *hostileRun, first, second *dns.Msg) {
				for _, m := range []*dns.Msg{first, second} {
					answers(t, m, 1)
					if m.Question[0].Name != "q.example.org." || m.Answer[0].Header().Name != "q.example.org." {
						t.Fatalf("client got %v, want its own case", m)
					}
				}
			},
		},
		{
			name: "TC set",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, nil, nil, nil)
				m.Truncated = true
				return m
			},
			// A UDP client's miss asks again over TCP; the truncated TCP
			// reply is dropped and passed on.
			asks: 4, drops: 2, log: "truncated",
			check: func(t *testing.T, _ *hostileRun, first, _ *dns.Msg) {
				if first == nil || !first.Truncated {
					t.Fatalf("client got %v, want the truncated reply", first)
				}
			},
		},
		{
			name: "opcode NOTIFY",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org.")}, nil, nil)
				m.Opcode = dns.OpcodeNotify
				return m
			},
			asks: 2, drops: 2, log: "opcode is not QUERY",
		},
		{
			name: "opcode UPDATE",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org.")}, nil, nil)
				m.Opcode = dns.OpcodeUpdate
				return m
			},
			asks: 2, drops: 2, log: "opcode is not QUERY",
		},
		// Errors other than SERVFAIL are passed on and never stored, as by
		// the stock cache; nothing counts or logs them.
		{name: "REFUSED", answer: withRcode(dns.RcodeRefused), asks: 2, log: "rcode REFUSED is not cached"},
		{name: "NOTIMP", answer: withRcode(dns.RcodeNotImplemented), asks: 2, log: "rcode NOTIMP is not cached"},
		{name: "FORMERR", answer: withRcode(dns.RcodeFormatError), asks: 2, log: "rcode FORMERR is not cached"},
		{
			name: "TTL 0",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{test.A("q.example.org. 0 IN A 192.0.2.1")}, nil, nil)
			},
			// Stored for the success MINTTL (5 s) and served with it, as by
			// the stock cache.
			entries: 1, asks: 1,
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				for _, m := range []*dns.Msg{first, second} {
					answers(t, m, 1)
					if ttl := m.Answer[0].Header().Ttl; ttl != uint32(config.MinDefaultTTL/time.Second) {
						t.Fatalf("served with TTL %d, want MINTTL", ttl)
					}
				}
				h.clk.advance(config.MinDefaultTTL)
				h.ask(t, test.Case{Qname: "q.example.org.", Qtype: dns.TypeA}.Msg(), false)
				if n := h.next.count("q.example.org."); n != 2 {
					t.Fatalf("upstream asked %d times after MINTTL, want 2", n)
				}
			},
		},
		{
			name:  "TTL 0 with MINTTL 0",
			setup: func(c *Cache) { c.SuccessMinTTL = 0 },
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{test.A("q.example.org. 0 IN A 192.0.2.1")}, nil, nil)
			},
			asks: 2, log: "TTL 0",
		},
		{
			name: "TTL above 2^31",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{test.A("q.example.org. 2147483653 IN A 192.0.2.1")}, nil, nil)
			},
			// RFC 2181 8: the TTL counts as 0. The entry lives as a TTL-0
			// answer's does, the success MINTTL, 5 s, and the record is
			// served with it.
			entries: 1, asks: 1,
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				for _, m := range []*dns.Msg{first, second} {
					answers(t, m, 1)
					if ttl := m.Answer[0].Header().Ttl; ttl != uint32(config.MinDefaultTTL/time.Second) {
						t.Fatalf("served with TTL %d, want MINTTL", ttl)
					}
				}
				h.clk.advance(config.MinDefaultTTL)
				h.ask(t, test.Case{Qname: "q.example.org.", Qtype: dns.TypeA}.Msg(), false)
				if n := h.next.count("q.example.org."); n != 2 {
					t.Fatalf("upstream asked %d times %v after the answer, want 2: the entry outlived a TTL of 0", n, config.MinDefaultTTL)
				}
			},
		},
		{
			name: "TTL above 2^31 beside a TTL of 300",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{test.A("q.example.org. 300 IN A 192.0.2.1"), test.A("q.example.org. 4294967295 IN A 192.0.2.2")}, nil, nil)
			},
			// The entry's TTL is the smallest, 0, so MINTTL: each record is
			// served with that.
			entries: 1, asks: 1,
			check: func(t *testing.T, h *hostileRun, first, _ *dns.Msg) {
				answers(t, first, 2)
				for _, rr := range first.Answer {
					if want := map[string]uint32{"192.0.2.1": 5, "192.0.2.2": 5}[rr.(*dns.A).A.String()]; rr.Header().Ttl != want {
						t.Fatalf("%s served with TTL %d, want %d", rr, rr.Header().Ttl, want)
					}
				}
				h.clk.advance(config.MinDefaultTTL)
				h.ask(t, test.Case{Qname: "q.example.org.", Qtype: dns.TypeA}.Msg(), false)
				if n := h.next.count("q.example.org."); n != 2 {
					t.Fatalf("upstream asked %d times %v after the answer, want 2: the entry outlived a TTL of 0", n, config.MinDefaultTTL)
				}
			},
		},
		{
			name: "records outside the answer chain",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org."), test.A("evil.example.net. 300 IN A 203.0.113.66")}, nil, nil)
			},
			// Stored as sent, like the stock cache: the entry answers only
			// its own question, so the record reaches only clients that
			// would get it from the upstream; it answers nothing for
			// evil.example.net.
			entries: 1, asks: 1,
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				answers(t, first, 2)
				answers(t, second, 2)
				got, _, _ := h.ask(t, test.Case{Qname: "evil.example.net.", Qtype: dns.TypeA}.Msg(), false)
				if n := h.next.count("evil.example.net."); n != 1 || got == nil {
					t.Fatalf("evil.example.net. asked upstream %d times, want 1: answered from q's entry", n)
				}
			},
		},
		{
			name: "answer only for another name",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{test.A("evil.example.net. 300 IN A 203.0.113.66")}, nil, nil)
			},
			asks: 2, drops: 2, log: "answer does not resolve the question",
		},
		{
			name: "CNAME chain with a stray record",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{
					test.CNAME("q.example.org. 300 IN CNAME t.example.net."), test.A("t.example.net. 300 IN A 192.0.2.9"),
					test.A("stray.example.com. 300 IN A 203.0.113.66"),
				}, nil, nil)
			},
			entries: 1, asks: 1,
			check: func(t *testing.T, _ *hostileRun, first, second *dns.Msg) {
				answers(t, first, 3)
				answers(t, second, 3)
			},
		},
		{
			name: "duplicate records",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org."), a("q.example.org.")}, nil, nil)
			},
			// Stored and served as sent.
			entries: 1, asks: 1,
			check: func(t *testing.T, _ *hostileRun, first, second *dns.Msg) {
				answers(t, first, 2)
				answers(t, second, 2)
				if second.Answer[0].String() != second.Answer[1].String() {
					t.Fatalf("answers %v, want the duplicate as sent", second.Answer)
				}
			},
		},
		{
			name:  "65,535-byte reply",
			qname: "big.example.org.", qtype: dns.TypeTXT, tcp: true,
			answer: func(t *testing.T, r *dns.Msg) *dns.Msg {
				m := exactSizeReply(t, r, dns.MaxMsgSize)
				if n := entryRecordsLen(t, m, r.Question[0].Name, dns.TypeTXT, dns.ClassINET); n > config.DefaultMaxEntry {
					t.Fatalf("records take %d bytes in an entry, over the limit", n)
				}
				return m
			},
			// Within the per-entry limit: stored. TCP clients get it whole,
			// UDP clients a truncated reply that fits.
			entries: 1, asks: 1,
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				want := len(h.next.last.Answer)
				for _, m := range []*dns.Msg{first, second} {
					answers(t, m, want)
					if b, _ := m.Pack(); len(b) > dns.MaxMsgSize {
						t.Fatalf("reply of %d bytes", len(b))
					}
				}
				udp, _, _ := h.ask(t, test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg(), false)
				if b, _ := udp.Pack(); udp == nil || !udp.Truncated || len(b) > dns.MinMsgSize {
					t.Fatalf("UDP client got %d bytes, TC=%v", len(b), udp.Truncated)
				}
			},
		},
		{
			name:  "reply larger than the per-entry limit (limit 4 KiB)",
			qname: "big.example.org.", qtype: dns.TypeTXT, tcp: true,
			setup: func(c *Cache) { c.MaxEntry = 4 << 10 },
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, txtRecords(r.Question[0].Name, 32, 255), nil, nil)
			},
			// Refused and counted; the client still gets the whole reply.
			asks: 2, refused: 2, log: "entry larger than the per-entry limit",
			check: func(t *testing.T, _ *hostileRun, first, second *dns.Msg) {
				answers(t, first, 32)
				answers(t, second, 32)
			},
		},
		{
			name:  "reply larger than the per-entry limit (64 KiB), 20 KB on the wire",
			qname: "big.example.org.", qtype: dns.TypeTXT, tcp: true,
			answer: func(t *testing.T, r *dns.Msg) *dns.Msg {
				// Additional records whose owner, a 255-byte name, compresses
				// to a pointer on the wire and stands whole in the entry.
				m := hostileReply(r, dns.RcodeSuccess, txtRecords(r.Question[0].Name, 1, 10), nil, nil)
				for i := range 500 {
					m.Extra = append(m.Extra, test.A(fmt.Sprintf("%s 300 IN A 192.0.%d.%d", longName, i/250, i%250)))
				}
				m.Compress = true
				if b, err := m.Pack(); err != nil || len(b) > dns.MaxMsgSize {
					t.Fatalf("reply of %d bytes on the wire: %v", len(b), err)
				}
				if n := entryRecordsLen(t, m, r.Question[0].Name, dns.TypeTXT, dns.ClassINET); n <= config.DefaultMaxEntry {
					t.Fatalf("records take %d bytes in an entry, within the limit", n)
				}
				return m
			},
			asks: 2, refused: 2, log: "entry larger than the per-entry limit",
		},
		{
			name:  "records at the per-entry limit under an ECS key of a 255-byte name",
			qname: longName, qtype: dns.TypeTXT, tcp: true,
			ecs: &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: dnsmsg.FamilyIPv4, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0).To4()},
			// One shard, so that every other name shares the entry's.
			setup: func(c *Cache) {
				c.Capacity = store.MinCapacity
				if err := c.init(); err != nil {
					panic(err)
				}
			},
			answer: func(t *testing.T, r *dns.Msg) *dns.Msg {
				if r.Question[0].Name != longName {
					return hostileReply(r, dns.RcodeSuccess, []dns.RR{a(r.Question[0].Name)}, nil, nil)
				}
				return atLimitECS(t, r)
			},
			// Within the per-entry limit, so it must be stored or refused;
			// the store must not panic, and the shard must stay usable.
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				if got, p, err := h.ask(t, test.Case{Qname: "other.example.org.", Qtype: dns.TypeA}.Msg(), false); got == nil || err != nil || p != nil {
					t.Fatalf("another name after it: %v, %v, panic %v", got, err, p)
				}
				stored := h.c.Stats().Entries
				if stored == 0 {
					if _, refused := counters(t, h.ctx); refused == 0 {
						t.Fatal("neither stored nor refused")
					}
				}
				for _, m := range []*dns.Msg{first, second} {
					if m == nil || m.Rcode != dns.RcodeSuccess {
						t.Fatalf("client got %v", m)
					}
				}
			},
			// The row's fixed expectations do not hold either way; check
			// says what does.
			entries: -1, asks: -1, drops: -1, refused: -1, log: "-",
		},
		{
			name: "extended RCODE to a client without EDNS",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeBadVers, nil, nil, nil) // 16: the upstream's OPT carries the high bits
			},
			// Not stored; the client must still get a reply: SERVFAIL, as it
			// cannot carry the extended RCODE without OPT.
			asks: 2, log: "is not cached",
			check: func(t *testing.T, _ *hostileRun, first, _ *dns.Msg) {
				if first.Rcode != dns.RcodeServerFailure {
					t.Fatalf("client got %v", first)
				}
			},
		},
		{
			name: "OPT in the answer section",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org."), opt}, nil, nil)
			},
			// OPT is hop-by-hop: stored without it, wherever it stood.
			entries: 1, asks: 1,
			check: func(t *testing.T, _ *hostileRun, first, second *dns.Msg) {
				answers(t, first, 1)
				answers(t, second, 1)
			},
		},
		{
			name: "OPT in the authority section",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}
				return hostileReply(r, dns.RcodeNameError, nil, []dns.RR{soa, opt}, nil)
			},
			entries: 1, asks: 1,
			check: func(t *testing.T, _ *hostileRun, _, second *dns.Msg) {
				if second == nil || second.Rcode != dns.RcodeNameError || len(second.Ns) != 1 || second.Ns[0].Header().Rrtype != dns.TypeSOA {
					t.Fatalf("client got %v, want NXDOMAIN with the SOA alone", second)
				}
			},
		},
		{
			name: "OPT alone in the answer section",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{opt}, nil, nil)
			},
			asks: 2, drops: 2, log: "answer does not resolve the question",
		},
		{
			name: "OPT alone in the authority section",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}
				return hostileReply(r, dns.RcodeSuccess, nil, []dns.RR{opt}, nil)
			},
			// A reply without records: stored for the minimum default TTL,
			// as the stock cache stores it, not for the TTL cap.
			entries: 1, asks: 1,
			check: func(t *testing.T, h *hostileRun, _, _ *dns.Msg) {
				h.clk.advance(config.MinDefaultTTL)
				h.ask(t, test.Case{Qname: "q.example.org.", Qtype: dns.TypeA}.Msg(), false)
				if n := h.next.count("q.example.org."); n != 2 {
					t.Fatalf("upstream asked %d times after %v, want 2: the entry outlived a reply without records", n, config.MinDefaultTTL)
				}
			},
		},
		{
			name: "malformed rdata: a record that does not pack",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				bad := &dns.A{Hdr: dns.RR_Header{Name: "q.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IP{192, 0, 2}}
				return hostileReply(r, dns.RcodeSuccess, []dns.RR{bad}, nil, nil)
			},
			// Dropped and logged; the client gets SERVFAIL, where a server
			// without the cache could not pack the reply and sent nothing.
			asks: 2, drops: 2, log: "overflow packing a", check: servfails,
		},
		{
			name: "malformed rdata in a reply that is not stored",
			answer: func(_ *testing.T, r *dns.Msg) *dns.Msg {
				bad := &dns.A{Hdr: dns.RR_Header{Name: "q.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IP{192, 0, 2}}
				return hostileReply(r, dns.RcodeRefused, []dns.RR{bad}, nil, nil)
			},
			// Counted as a drop, as when it would be stored: the client
			// gets SERVFAIL in its place.
			asks: 2, drops: 2, log: "overflow packing a", check: servfails,
		},
		{
			name: "malformed rdata: bytes through Write that do not unpack",
			raw: func(_ *testing.T, r *dns.Msg) []byte {
				b, _ := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org.")}, nil, nil).Pack()
				return b[:len(b)-3]
			},
			asks: 2, drops: 2, noReply: true, log: "bytes that do not unpack",
		},
		{
			name: "bytes through Write that unpack",
			raw: func(_ *testing.T, r *dns.Msg) []byte {
				b, _ := hostileReply(r, dns.RcodeSuccess, []dns.RR{a("q.example.org.")}, nil, nil).Pack()
				return b
			},
			// Passed on, not cached: only replies the cache can check are.
			asks: 2, log: "Not caching a reply written as bytes",
			check: func(t *testing.T, _ *hostileRun, first, _ *dns.Msg) { answers(t, first, 1) },
		},
		{
			name:  "malformed rdata: CNAME with RDLENGTH 0 from the wire",
			qtype: dns.TypeCNAME,
			answer: func(t *testing.T, r *dns.Msg) *dns.Msg {
				// What forward hands on for such a record: miekg/dns unpacks
				// RDLENGTH 0 as an empty CNAME.
				m := hostileReply(r, dns.RcodeSuccess, []dns.RR{test.CNAME("q.example.org. 300 IN CNAME t.example.org.")}, nil, nil)
				b, err := m.Pack()
				if err != nil {
					t.Fatal(err)
				}
				// Type, class, TTL 300, then RDLENGTH: set it to 0 and cut
				// the rdata out.
				at := bytes.Index(b[dnsmsg.HeaderLen:], []byte{0, byte(dns.TypeCNAME), 0, 1, 0, 0, 1, 44}) + dnsmsg.HeaderLen + 8
				rdlen := int(b[at])<<8 | int(b[at+1])
				b[at], b[at+1] = 0, 0
				b = append(b[:at+2], b[at+2+rdlen:]...)
				wire := new(dns.Msg)
				if err := wire.Unpack(b); err != nil || len(wire.Answer) != 1 || wire.Answer[0].(*dns.CNAME).Target != "" {
					t.Fatalf("%v: %v", err, wire)
				}
				return wire
			},
			// It is an answer to the question; stored or not, the client
			// gets a reply and the cache does not panic.
			check: func(t *testing.T, h *hostileRun, first, second *dns.Msg) {
				for _, m := range []*dns.Msg{first, second} {
					if m == nil {
						t.Fatal("client got nothing")
					}
				}
			},
			entries: -1, asks: -1, drops: -1, refused: -1, log: "-",
		},
	}
}

// atLimitECS answers r with records that take 65,536 bytes in an entry
// (the per-entry limit) for a 255-byte qname, echoing the ECS of r, in a
// reply that fits 64 KiB on the wire: what forward can hand the cache.
func atLimitECS(t *testing.T, r *dns.Msg) *dns.Msg {
	q := r.Question[0]
	m := hostileReply(r, dns.RcodeSuccess, nil, nil, nil)
	e := *dnsmsg.Subnet(r)
	e.SourceScope = e.SourceNetmask
	m.IsEdns0().Option = []dns.EDNS0{&e}
	// A records owned by the qname's parent: a pointer on the wire, 191
	// bytes in the entry.
	parent := q.Name[strings.Index(q.Name, ".")+1:]
	for i := range 100 {
		m.Extra = append(m.Extra, test.A(fmt.Sprintf("%s 300 IN A 192.0.2.%d", parent, i)))
	}
	m.Answer = txtRecords(q.Name, 171, 255)
	m.Answer = append(m.Answer, txtRecords(q.Name, 1, 155)...)
	if n := entryRecordsLen(t, m, q.Name, q.Qtype, q.Qclass); n != config.DefaultMaxEntry {
		t.Fatalf("records take %d bytes in an entry, want %d", n, config.DefaultMaxEntry)
	}
	m.Compress = true
	if b, err := m.Pack(); err != nil || len(b) > dns.MaxMsgSize {
		t.Fatalf("reply of %d bytes on the wire: %v", len(b), err)
	}
	return m
}

func TestHostileUpstream(t *testing.T) {
	logs := debugLog(t)
	for _, row := range hostileRows() {
		t.Run(row.name, func(t *testing.T) {
			qname, qtype := row.qname, row.qtype
			if qname == "" {
				qname = "q.example.org."
			}
			if qtype == 0 {
				qtype = dns.TypeA
			}
			next := &hostileNext{asked: map[string]int{}}
			if row.answer != nil {
				next.answer = func(r *dns.Msg) *dns.Msg { return row.answer(t, r) }
			}
			if row.raw != nil {
				next.raw = func(r *dns.Msg) []byte { return row.raw(t, r) }
			}
			clk := newClock()
			c := New()
			c.Next, c.now = next, clk.now
			if row.setup != nil {
				row.setup(c)
			}
			h := &hostileRun{c: c, clk: clk, next: next, ctx: hostileServer(row.name)}
			req := test.Case{Qname: qname, Qtype: qtype}.Msg()
			if row.ecs != nil {
				req.SetEdns0(4096, false)
				req.IsEdns0().Option = []dns.EDNS0{row.ecs}
			}
			drops0, refused0 := counters(t, h.ctx)
			mark := len(logs.String())

			var replies [2]*dns.Msg
			for i := range replies {
				got, panicked, err := h.ask(t, req, row.tcp)
				if panicked != nil {
					t.Fatalf("query %d: panic: %v", i, panicked)
				}
				if row.noReply != (err != nil) || row.noReply != (got == nil) {
					t.Fatalf("query %d: client got %v, ServeDNS error %v; want a reply: %v", i, got, err, !row.noReply)
				}
				if got != nil && (got.Id != req.Id || (len(got.Question) != 1 ||
					!strings.EqualFold(got.Question[0].Name, qname) || got.Question[0].Qtype != qtype)) {
					t.Fatalf("query %d: reply %v to %v", i, got, req)
				}
				if i == 0 && row.entries >= 0 {
					if n := c.Stats().Entries; n != row.entries {
						t.Errorf("%d entries stored, want %d", n, row.entries)
					}
				}
				replies[i] = got
			}
			if n := next.count(qname); row.asks >= 0 && n != row.asks {
				t.Errorf("upstream asked %d times for two queries, want %d", n, row.asks)
			}
			drops, refused := counters(t, h.ctx)
			if row.drops >= 0 && drops-drops0 != row.drops {
				t.Errorf("drops counted %v, want %v", drops-drops0, row.drops)
			}
			if row.refused >= 0 && refused-refused0 != row.refused {
				t.Errorf("refused counted %v, want %v", refused-refused0, row.refused)
			}
			logged := logs.String()[mark:]
			switch {
			case row.log == "-":
			case row.log == "" && strings.Contains(logged, debugPrefix):
				t.Errorf("debug lines logged, want none:\n%s", logged)
			case row.log != "" && !(strings.Contains(logged, debugPrefix) && strings.Contains(logged, row.log)):
				t.Errorf("debug log %q, want a line with %q", logged, row.log)
			}
			if row.check != nil {
				row.check(t, h, replies[0], replies[1])
			}
		})
	}
}

// TestVerifyTooLargeServesStale: under serve_stale verify, waiting for the
// fetch or with a timeout, a reply that refreshes the entry but is too large
// for an entry, and for a message (over 64 KiB), cannot be passed on: the
// client gets the stale entry, counted in served_stale_total, where it got
// SERVFAIL. The reply is counted once, in refused_total, as on a miss: not
// again in drops_total.
func TestVerifyTooLargeServesStale(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Hour} { // an hour: the fetch ends first
		t.Run(timeout.String(), func(t *testing.T) {
			n := 1
			next := &hostileNext{asked: map[string]int{}, answer: func(r *dns.Msg) *dns.Msg {
				return hostileReply(r, dns.RcodeSuccess, txtRecords(r.Question[0].Name, n, 255), nil, nil)
			}}
			clk := newClock()
			c := New()
			c.Next, c.now = next, clk.now
			c.StaleUpTo, c.VerifyStale, c.VerifyTimeout = time.Hour, true, timeout
			h := &hostileRun{c: c, clk: clk, next: next, ctx: hostileServer("verify of a reply over 64 KiB, timeout " + timeout.String())}
			req := test.Case{Qname: "big.example.org.", Qtype: dns.TypeTXT}.Msg()
			if got, _, _ := h.ask(t, req, true); got == nil || len(got.Answer) != 1 {
				t.Fatalf("first reply %v", got)
			}
			clk.advance(301 * time.Second)
			n = 300 // 77 KB of records
			drops0, refused0 := counters(t, h.ctx)
			got, _, _ := h.ask(t, req, true)
			if got == nil || len(got.Answer) != 1 || got.Answer[0].Header().Ttl != 30 {
				t.Fatalf("reply %v; want the stale entry, its TTL 30", got)
			}
			drops, refused := counters(t, h.ctx)
			if drops != drops0 || refused != refused0+1 {
				t.Fatalf("drops_total +%v, refused_total +%v; want +0, +1", drops-drops0, refused-refused0)
			}
			labels := map[string]string{"server": h.ctx.Value(dnsserver.Key{}).(*dnsserver.Server).Addr, "zones": "", "view": ""}
			if stale := seriesValue(t, "coredns_compactcache_served_stale_total", labels); stale != 1 {
				t.Fatalf("served_stale_total %v, want 1", stale)
			}
		})
	}
}
