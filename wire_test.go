package compactcache

import (
	"net"
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
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
	e, err := entry.NewBuilder().Build(m, entry.AppendKey(nil, []byte("\x01a\x07example\x03org\x00"), dns.TypeA, dns.ClassINET, false), "a.example.org.", 1, entryTTL, 0, 0, defaultMaxEntry)
	if err != nil {
		t.Fatal(err)
	}
	off := e.RecordsStart()
	for i, ttl := range ttls {
		var r entry.Record
		next := e.Record(off, &r)
		own := entry.WireTTL(ttl) < entryTTL
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
	if err := reply.Unpack(b.appendReply(&q, e, ttlView{age: age})); err != nil {
		t.Fatal(err)
	}
	if len(reply.Answer) != len(ttls) {
		t.Fatalf("a reply of %d answers from an entry of %d", len(reply.Answer), len(ttls))
	}
	for i, ttl := range ttls {
		want := uint32(0)
		if left := min(entry.WireTTL(ttl), entryTTL); left > age {
			want = left - age
		}
		if got := reply.Answer[i].Header().Ttl; got != want {
			t.Errorf("record of TTL %d in an entry of %d, aged %d s: a reply gives it %d, want %d", ttl, entryTTL, age, got, want)
		}
	}
}
