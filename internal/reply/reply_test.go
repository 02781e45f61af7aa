package reply

import (
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/miekg/dns"
)

// TestTypifyMatchesCoreDNS compares Scan.Type with CoreDNS's
// response.Typify, which it replaces, over every combination of RCODE,
// qtype, answer, authority, signature validity and DO.
func TestTypifyMatchesCoreDNS(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	sig := func(valid bool) dns.RR {
		s := &dns.RRSIG{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeRRSIG, Class: dns.ClassINET, Ttl: 60}, TypeCovered: dns.TypeA}
		s.Inception, s.Expiration = uint32(now.Unix()-3600), uint32(now.Unix()+3600)
		if !valid {
			s.Expiration = uint32(now.Unix() - 60)
		}
		return s
	}
	answers := [][]dns.RR{
		nil,
		{testenv.MustRR(t, "a.example. 60 IN A 192.0.2.1")},
		{testenv.MustRR(t, "a.example. 60 IN CNAME b.example.")},
		{testenv.MustRR(t, "a.example. 60 IN A 192.0.2.1"), sig(true)},
		{testenv.MustRR(t, "a.example. 60 IN A 192.0.2.1"), sig(false)},
	}
	soa := testenv.MustRR(t, "example. 60 IN SOA ns.example. h.example. 1 2 3 4 5")
	ns := testenv.MustRR(t, "example. 60 IN NS ns.example.")
	authorities := [][]dns.RR{nil, {soa}, {ns}, {ns, soa}, {sig(false)}}
	types := map[response.Type]int{}
	for _, rcode := range []int{dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure, dns.RcodeNameError, dns.RcodeNotImplemented, dns.RcodeRefused} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAXFR, dns.TypeIXFR} {
			for _, answer := range answers {
				for _, authority := range authorities {
					for _, do := range []int{-1, 0, 1} { // no OPT, OPT without DO, with DO
						m := new(dns.Msg)
						m.SetQuestion("a.example.", qtype)
						m.Response, m.Rcode, m.Answer, m.Ns = true, rcode, answer, authority
						if do >= 0 {
							m.SetEdns0(1232, do == 1)
						}
						want, _ := response.Typify(m, now)
						sc := Read(m, now)
						if got := sc.Type(m); got != want {
							t.Errorf("%s: typify %s, response.Typify %s", m, got, want)
						}
						types[want]++
					}
				}
			}
		}
	}
	// The grid reaches every type a QUERY reply can get.
	for _, typ := range []response.Type{response.NoError, response.NameError, response.ServerError, response.NoData, response.Delegation, response.Meta, response.OtherError} {
		if types[typ] == 0 {
			t.Errorf("no case of %s", typ)
		}
	}
}
