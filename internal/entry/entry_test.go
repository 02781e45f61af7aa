package entry

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestPlainRecords: an entry of records that only repeat the question's
// name, type, class and the entry's TTL, all answers, is stored as their
// rdata alone (flagPlain), and every entry reads back the records it was
// built from, in each section.
func TestPlainRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		qtype  uint16
		qclass uint16
		rcode  int
		rrs    [3][]string
		plain  bool
		body   int // the bytes after the key
	}{
		{"A", dns.TypeA, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN A 192.0.2.1", "q. 300 IN A 192.0.2.2", "q. 300 IN A 192.0.2.3"}}, true, 3 * 4},
		{"AAAA", dns.TypeAAAA, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN AAAA 2001:db8::1", "q. 300 IN AAAA 2001:db8::2"}}, true, 2 * 16},
		{"TXT", dns.TypeTXT, dns.ClassINET, dns.RcodeSuccess, [3][]string{{`q. 300 IN TXT "a"`, `q. 300 IN TXT "bc" "d"`}}, true, 2 + 2 + 2 + 5},
		{"MX", dns.TypeMX, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN MX 10 mx.q."}}, true, 2 + 2 + 6},
		{"CH TXT", dns.TypeTXT, dns.ClassCHAOS, dns.RcodeSuccess, [3][]string{{`q. 300 CH TXT "x"`}}, true, 2 + 2},
		{"SERVFAIL", dns.TypeA, dns.ClassINET, dns.RcodeServerFailure, [3][]string{}, true, 0},
		{"a TTL of its own", dns.TypeA, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN A 192.0.2.1", "q. 30 IN A 192.0.2.2"}}, false, 0},
		{"through a CNAME", dns.TypeA, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN CNAME r.", "r. 300 IN A 192.0.2.1"}}, false, 0},
		{"with additional", dns.TypeMX, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN MX 10 mx.q."}, nil, {"mx.q. 300 IN A 192.0.2.1"}}, false, 0},
		{"denial", dns.TypeA, dns.ClassINET, dns.RcodeNameError, [3][]string{nil, {"q. 300 IN SOA ns.q. h.q. 1 2 3 4 300"}}, false, 0},
		{"signed", dns.TypeA, dns.ClassINET, dns.RcodeSuccess, [3][]string{{"q. 300 IN A 192.0.2.1", "q. 300 IN RRSIG A 13 1 300 20300101000000 20200101000000 1 q. AAAA"}}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.Question = []dns.Question{{Name: "q.", Qtype: tc.qtype, Qclass: tc.qclass}}
			m.Response, m.Rcode = true, tc.rcode
			sections := [3]*[]dns.RR{&m.Answer, &m.Ns, &m.Extra}
			for s, texts := range tc.rrs {
				for _, text := range texts {
					rr, err := dns.NewRR(text)
					if err != nil {
						t.Fatal(err)
					}
					*sections[s] = append(*sections[s], rr)
				}
			}
			key, err := KeyFor("q.", tc.qtype, tc.qclass, false)
			if err != nil {
				t.Fatal(err)
			}
			e, err := NewBuilder().Build(m, key, "q.", 1, 300, 0, uint16(tc.rcode)|FlagDNSSEC, 1<<16) // every record kept
			if err != nil {
				t.Fatal(err)
			}
			if err := Check(e); err != nil {
				t.Fatal(err)
			}
			if plain := e.Flags()&flagPlain != 0; plain != tc.plain {
				t.Fatalf("plain %v, want %v", plain, tc.plain)
			}
			if tc.plain && e.Size()-e.body() != tc.body {
				t.Errorf("a plain body of %d bytes, want %d", e.Size()-e.body(), tc.body)
			}
			if e.QClass() != tc.qclass || e.Rcode() != tc.rcode || !bytes.Equal(e.Key(), key) {
				t.Errorf("class %d, rcode %d, key %x; want %d, %d, %x", e.QClass(), e.Rcode(), e.Key(), tc.qclass, tc.rcode, key)
			}
			var counts [3]int
			off := e.Records(&counts)
			for s, want := range sections {
				if counts[s] != len(*want) {
					t.Fatalf("section %d: %d records, want %d", s, counts[s], len(*want))
				}
				for _, rr := range *want {
					var r Record
					off = e.Record(off, &r)
					if got := recordText(t, r, e.QName()); got != rr.String() {
						t.Errorf("section %d: record %s, want %s", s, got, rr)
					}
				}
			}
			if off != e.Size() {
				t.Errorf("records end at %d, the entry at %d", off, e.Size())
			}
		})
	}
}

// recordText returns r in presentation form, with its own TTL or else the
// entry's, which in TestPlainRecords is every record's.
func recordText(t *testing.T, r Record, qname []byte) string {
	t.Helper()
	owner := r.Owner
	if owner == nil {
		owner = qname
	}
	wire := append([]byte(nil), owner...)
	wire = append(wire, byte(r.Type>>8), byte(r.Type), byte(r.Class>>8), byte(r.Class), byte(r.TTL>>24), byte(r.TTL>>16), byte(r.TTL>>8), byte(r.TTL), byte(len(r.Rdata)>>8), byte(len(r.Rdata)))
	wire = append(wire, r.Rdata...)
	rr, _, err := dns.UnpackRR(wire, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rr.String()
}

// TestFixedRdlens: plainCount counts a body of fixed-length records by a
// shift, so every fixed length must be a power of two.
func TestFixedRdlens(t *testing.T) {
	for ty := range 1 << 16 {
		if n := fixedRdlen(uint16(ty)); n&(n-1) != 0 {
			t.Errorf("type %d: fixed rdata length %d, not a power of two", ty, n)
		}
	}
}

func TestProbed(t *testing.T) {
	for _, tc := range []struct {
		qtype, qclass uint16
		want          bool
	}{
		{dns.TypeA, dns.ClassINET, true},
		{dns.TypeHTTPS, dns.ClassINET, true},
		{dns.TypeTXT, dns.ClassCHAOS, true},
		{65280, dns.ClassINET, false},
		{dns.TypeA, dns.ClassANY, false},
		{dns.TypeA, dns.ClassHESIOD, false},
	} {
		if got := Probed(tc.qtype, tc.qclass); got != tc.want {
			t.Errorf("Probed(%s, %s) = %t", dns.Type(tc.qtype), dns.Class(tc.qclass), got)
		}
	}
}

// TestValidFor: a signature's expiration is a serial number, compared with
// now modulo 2^32 (RFC 4034 3.1.5): the nearer of the times it names.
func TestValidFor(t *testing.T) {
	for _, tc := range []struct {
		expiration, now, want uint32
	}{
		{expiration: 1_800_000_100, now: 1_800_000_000, want: 100},
		{expiration: 1_800_000_000, now: 1_800_000_000, want: 0},
		{expiration: 1_799_999_999, now: 1_800_000_000, want: 0},
		{expiration: 50, now: math.MaxUint32 - 49, want: 100}, // past 2106, wrapped
		{expiration: math.MaxUint32 - 49, now: 50, want: 0},   // long past, not 136 years ahead
		{expiration: 1<<31 - 1, now: 0, want: 1<<31 - 1},      // the farthest ahead
	} {
		if got := ValidFor(&dns.RRSIG{Expiration: tc.expiration}, tc.now); got != tc.want {
			t.Errorf("ValidFor(expiration %d, now %d) = %d, want %d", tc.expiration, tc.now, got, tc.want)
		}
	}
}

// TestPopularity: hits count as the stock cache's prefetch counts them, in a
// row with no gap of more than the window, however long after the entry was
// stored they come (its TTL may be a day).
func TestPopularity(t *testing.T) {
	const stored, window = 1000, 60
	for _, tc := range []struct {
		name string
		hits []int64 // seconds after stored
		want int
	}{
		{"in a row", []int64{10, 70, 130}, 3},
		{"a gap", []int64{10, 71, 100}, 2},
		{"in a row past 18 hours", []int64{70000, 70060, 70120}, 3},
		{"gaps past 18 hours", []int64{66000, 67000, 68000}, 1},
		{"a gap across 18 hours", []int64{65500, 65600}, 1},
		{"in a row across 18 hours", []int64{65500, 65540}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("q.", dns.TypeA)
			m.Response = true
			key, err := KeyFor("q.", dns.TypeA, dns.ClassINET, false)
			if err != nil {
				t.Fatal(err)
			}
			e, err := NewBuilder().Build(m, key, "q.", stored, 86400, 0, 0, 1<<16)
			if err != nil {
				t.Fatal(err)
			}
			for _, at := range tc.hits {
				e.Hit(stored+at, window)
			}
			if got := e.Popularity(); got != tc.want {
				t.Errorf("popularity %d, want %d", got, tc.want)
			}
			last := tc.hits[len(tc.hits)-1]
			if got := e.Idle(stored + last + 30); got != 30 {
				t.Errorf("idle 30 s after the last hit: %d", got)
			}
		})
	}
}

// TestOwnerLength: Build refuses an owner past 255 bytes in wire form,
// which miekg/dns packs but Check refuses: one such entry stored made a
// snapshot holding it unreadable, all of it. One of 255 bytes is kept.
func TestOwnerLength(t *testing.T) {
	label := strings.Repeat("a", 63) + "."
	for _, tc := range []struct {
		name  string
		owner string
		ok    bool
	}{
		{"255 bytes", strings.Repeat(label, 3) + strings.Repeat("b", 61) + ".", true},
		{"256 bytes", strings.Repeat(label, 4), false},
		{"256 bytes with an escape", strings.Repeat(label, 3) + `\.` + strings.Repeat("b", 61) + ".", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("q.", dns.TypeA)
			m.Response = true
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "q.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: []byte{192, 0, 2, 1}}}
			m.Extra = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: tc.owner, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300}, Txt: []string{"x"}}}
			key, err := KeyFor("q.", dns.TypeA, dns.ClassINET, false)
			if err != nil {
				t.Fatal(err)
			}
			e, err := NewBuilder().Build(m, key, "q.", 1, 300, 0, 0, 1<<16)
			if (err == nil) != tc.ok {
				t.Fatalf("Build: %v, want it to succeed: %t", err, tc.ok)
			}
			if err == nil {
				if err := Check(e); err != nil {
					t.Errorf("Check refuses what Build made: %v", err)
				}
			}
		})
	}
}
