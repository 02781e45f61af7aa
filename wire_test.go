package compactcache

import (
	"math"
	"net"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

// TestRecordTTLsKeptBelowTheEntrys: a record keeps a TTL of its own only
// when it is lower than the entry's (a TTL with the top bit set counts as 0,
// RFC 2181 8), and a reply gives every record the TTL it gave before records
// dropped theirs: the lower of its own and the entry's, aged.
func TestRecordTTLsKeptBelowTheEntrys(t *testing.T) {
	m := new(dns.Msg).SetQuestion("a.example.org.", dns.TypeA)
	m.Response = true
	ttls := []uint32{0, 2, 300, 3600, 1 << 31}
	for i, ttl := range ttls {
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: "a.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
			A:   net.IPv4(192, 0, 2, byte(i+1)),
		})
	}
	const entryTTL = 300 // the lowest TTL, raised to a minimum of 300
	e, err := entry.NewBuilder().Build(m, entry.AppendKey(nil, []byte("\x01a\x07example\x03org\x00"), dns.TypeA, dns.ClassINET, false), "a.example.org.", 1, entryTTL, 0, 0, config.DefaultMaxEntry)
	if err != nil {
		t.Fatal(err)
	}
	off := e.Records(new([3]int))
	for i, ttl := range ttls {
		var r entry.Record
		next := e.Record(off, &r)
		own := dnsmsg.WireTTL(ttl) < entryTTL
		if got := r.Flags&entry.RecTTLIsEntry == 0; got != own {
			t.Errorf("record of TTL %d in an entry of %d: keeps its own %v, want %v", ttl, entryTTL, got, own)
		}
		// flags, TTL when kept, RDLENGTH, the address: owner, type and class are the question's
		size := 1 + 2 + 4
		if own {
			size += 4
		}
		if next-off != size {
			t.Errorf("record %d takes %d bytes, want %d", i, next-off, size)
		}
		off = next
	}
	const age = 1
	q := query{id: 1, name: []byte("\x01a\x07example\x03org\x00"), qtype: dns.TypeA, qclass: dns.ClassINET, limit: dns.MaxMsgSize}
	b := newReplyBuffers()
	reply := new(dns.Msg)
	if err := reply.Unpack(b.appendReply(&q, e, replyForm{age: age})); err != nil {
		t.Fatal(err)
	}
	if len(reply.Answer) != len(ttls) {
		t.Fatalf("a reply of %d answers from an entry of %d", len(reply.Answer), len(ttls))
	}
	for i, ttl := range ttls {
		want := uint32(0)
		if left := min(dnsmsg.WireTTL(ttl), entryTTL); left > age {
			want = left - age
		}
		if got := reply.Answer[i].Header().Ttl; got != want {
			t.Errorf("record of TTL %d in an entry of %d, aged %d s: a reply gives it %d, want %d", ttl, entryTTL, age, got, want)
		}
	}
}

// TestRotationAsLoadbalance writes a reply of every record kind the
// loadbalance plugin's round_robin policy regroups, rotated, many times:
// each reply keeps loadbalance's grouping (CNAME, other types, addresses,
// MX) in every section, unpacks with its MX targets intact, and every order
// of the addresses and of the MX records comes about as often as the others.
func TestRotationAsLoadbalance(t *testing.T) {
	m := new(dns.Msg).SetQuestion("a.example.org.", dns.TypeA)
	m.Response = true
	m.Answer = []dns.RR{
		mustRR(t, "a.example.org. 300 IN A 192.0.2.1"),
		mustRR(t, "a.example.org. 300 IN MX 10 mx1.example.org."),
		mustRR(t, "a.example.org. 300 IN TXT \"t\""),
		mustRR(t, "a.example.org. 300 IN A 192.0.2.2"),
		mustRR(t, "a.example.org. 300 IN CNAME b.example.org."),
		mustRR(t, "a.example.org. 300 IN AAAA 2001:db8::3"),
		mustRR(t, "a.example.org. 300 IN MX 20 mx2.example.org."),
	}
	m.Extra = []dns.RR{mustRR(t, "mx1.example.org. 300 IN A 192.0.2.25"), mustRR(t, "mx2.example.org. 300 IN A 192.0.2.26")}
	e, err := entry.NewBuilder().Build(m, entry.AppendKey(nil, []byte("\x01a\x07example\x03org\x00"), dns.TypeA, dns.ClassINET, false), "a.example.org.", 1, 300, 0, 0, config.DefaultMaxEntry)
	if err != nil {
		t.Fatal(err)
	}
	q := query{id: 1, name: []byte("\x01a\x07example\x03org\x00"), qtype: dns.TypeA, qclass: dns.ClassINET, limit: dns.MaxMsgSize, rotate: true}
	b := newReplyBuffers()
	const n = 6000
	addrOrders, mxOrders, extraOrders := map[string]int{}, map[string]int{}, map[string]int{}
	for range n {
		r := new(dns.Msg)
		if err := r.Unpack(b.appendReply(&q, e, replyForm{})); err != nil {
			t.Fatalf("a rotated reply does not unpack: %v", err)
		}
		var types, addrs, mxs []string
		for _, rr := range r.Answer {
			types = append(types, dns.TypeToString[rr.Header().Rrtype])
			switch rr := rr.(type) {
			case *dns.A:
				addrs = append(addrs, rr.A.String())
			case *dns.AAAA:
				addrs = append(addrs, rr.AAAA.String())
			case *dns.MX:
				mxs = append(mxs, rr.Mx)
			}
		}
		if got := strings.Join(types, " "); got != "CNAME TXT A A AAAA MX MX" && got != "CNAME TXT A AAAA A MX MX" && got != "CNAME TXT AAAA A A MX MX" {
			t.Fatalf("answer section in the order %s: not loadbalance's grouping", got)
		}
		addrOrders[strings.Join(addrs, " ")]++
		mxOrders[strings.Join(mxs, " ")]++
		var extra []string
		for _, rr := range r.Extra {
			extra = append(extra, rr.(*dns.A).A.String())
		}
		extraOrders[strings.Join(extra, " ")]++
	}
	// Each of 6 orders of the addresses is expected n/6 times; 4 standard
	// deviations (about 116) either side fail one run in 10^4.
	for _, c := range []struct {
		what   string
		orders map[string]int
		want   int
	}{{"addresses", addrOrders, 6}, {"MX records", mxOrders, 2}, {"additional addresses", extraOrders, 2}} {
		if len(c.orders) != c.want {
			t.Errorf("%s: %d orders over %d replies, want %d: %v", c.what, len(c.orders), n, c.want, c.orders)
		}
		mean := float64(n) / float64(c.want)
		sd := math.Sqrt(mean * (1 - 1/float64(c.want)))
		for order, k := range c.orders {
			if math.Abs(float64(k)-mean) > 4*sd {
				t.Errorf("%s: order %q in %d of %d replies, expected %.0f", c.what, order, k, n, mean)
			}
		}
	}
	if !raceEnabled {
		if allocs := testing.AllocsPerRun(100, func() { b.appendReply(&q, e, replyForm{}) }); allocs != 0 {
			t.Errorf("%v allocations per rotated reply, want 0", allocs)
		}
	}
	// Without rotation the order is the upstream's.
	q.rotate = false
	r := new(dns.Msg)
	if err := r.Unpack(b.appendReply(&q, e, replyForm{})); err != nil || r.Answer[0].Header().Rrtype != dns.TypeA || r.Answer[4].Header().Rrtype != dns.TypeCNAME {
		t.Errorf("a reply not rotated is in another order than the upstream's: %v, %v", r.Answer, err)
	}
}

// BenchmarkAppendReply writes hits of the reference workload's entries, which
// lie in the processor's caches: the reply writer's own cost, apart from the
// store's reads.
func BenchmarkAppendReply(b *testing.B) {
	const n = 64
	builder := entry.NewBuilder()
	var entries []entry.Entry
	var queries []query
	for i := range n {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, dns.ClassINET, false)
		if err != nil {
			b.Fatal(err)
		}
		e, err := builder.Build(m, key, m.Question[0].Name, 1, 3600, 0, 0, config.DefaultMaxEntry)
		if err != nil {
			b.Fatal(err)
		}
		entries = append(entries, append(entry.Entry(nil), e...))
		queries = append(queries, query{id: uint16(i), name: append([]byte(nil), e.QName()...), qtype: e.QType(), qclass: dns.ClassINET, limit: dns.MaxMsgSize})
	}
	rb := newReplyBuffers()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rb.appendReply(&queries[i], entries[i], replyForm{age: 1})
		i = (i + 1) % n
	}
}

// TestPlainReplies: a plain entry's reply (appendPlain) holds its records as
// the upstream sent them, with their TTLs aged (or fixed, as serve-stale
// gives them), and OPT for an EDNS client, in the bytes miekg/dns packs them
// to; rotated, the addresses take every order; over the client's limit, the
// answer is dropped whole and TC set. Plain records of types whose rdata
// names are compressed go through the general loop, checked the same.
func TestPlainReplies(t *testing.T) {
	for _, tc := range []struct {
		qtype   uint16
		records []string
	}{
		{dns.TypeA, []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}},
		{dns.TypeAAAA, []string{"2001:db8::1"}},
		{dns.TypeTXT, []string{`"one"`, `"two" "three"`}},
		{dns.TypeSRV, []string{"0 5 53 ns.example.org."}},
		{dns.TypeMX, []string{"10 mx.example.org.", "20 mx.plain.example.org."}},
	} {
		t.Run(dns.TypeToString[tc.qtype], func(t *testing.T) {
			const name, wire = "plain.example.org.", "\x05plain\x07example\x03org\x00"
			m := new(dns.Msg).SetQuestion(name, tc.qtype)
			m.Response = true
			for _, rd := range tc.records {
				m.Answer = append(m.Answer, mustRR(t, name+" 300 IN "+dns.TypeToString[tc.qtype]+" "+rd))
			}
			e, err := entry.NewBuilder().Build(m, entry.AppendKey(nil, []byte(wire), tc.qtype, dns.ClassINET, false), name, 1, 300, 0, 0, config.DefaultMaxEntry)
			if err != nil {
				t.Fatal(err)
			}
			if !e.Plain() {
				t.Fatal("the entry is not plain")
			}
			q := query{id: 7, name: []byte(wire), qtype: tc.qtype, qclass: dns.ClassINET, limit: dns.MaxMsgSize}
			b := newReplyBuffers()
			got := b.appendReply(&q, e, replyForm{age: 40})

			want := m.Copy()
			want.Id, want.RecursionDesired = 7, false
			for _, rr := range want.Answer {
				rr.Header().Ttl = 260
			}
			want.Compress = true
			wb, err := want.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(wb) {
				t.Fatalf("reply\n%x\nwant (miekg/dns)\n%x", got, wb)
			}

			// With EDNS and DO, the OPT record after the answer; a
			// serve-stale reply's fixed TTL.
			q.edns, q.do, q.udpSize = true, true, 1232
			want.SetEdns0(1232, true)
			for _, rr := range want.Answer {
				rr.Header().Ttl = 30
			}
			if wb, err := want.Pack(); err != nil || string(b.appendReply(&q, e, replyForm{fixed: true, value: 30})) != string(wb) {
				t.Fatalf("with EDNS, DO and a fixed TTL, the reply is not as miekg/dns packs it (%v)", err)
			}
			q.edns, q.do = false, false

			q.rotate = true
			orders := map[string]bool{}
			for range 200 {
				r := new(dns.Msg)
				if err := r.Unpack(b.appendReply(&q, e, replyForm{age: 40})); err != nil || len(r.Answer) != len(tc.records) {
					t.Fatalf("rotated: %v, %v", r, err)
				}
				var order []string
				for _, rr := range r.Answer {
					order = append(order, rr.String())
				}
				orders[strings.Join(order, "|")] = true
			}
			if wantOrders := map[uint16]int{dns.TypeA: 6, dns.TypeMX: 2}[tc.qtype]; len(orders) != max(wantOrders, 1) {
				t.Errorf("rotated: %d orders, want %d", len(orders), max(wantOrders, 1))
			}

			q.rotate, q.limit = false, len(wb)-1
			r := new(dns.Msg)
			if err := r.Unpack(b.appendReply(&q, e, replyForm{age: 40})); err != nil || !r.Truncated || len(r.Answer) != 0 {
				t.Errorf("a byte over the limit: TC %t, %d answers, %v", r.Truncated, len(r.Answer), err)
			}
		})
	}
}
