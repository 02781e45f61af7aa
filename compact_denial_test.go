package compactcache

import (
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestCompactDenial: a compact denial of existence (RFC 9824), the NOERROR
// without data that an upstream signing on the fly answers a DO query for a
// name that does not exist, with NXNAME in the NSEC of the name, reaches a
// client without DO as NXDOMAIN (section 5), from the upstream and from the
// cache, and a DO client as the upstream sent it. Without NXNAME, or with it
// in another name's NSEC, it is the NODATA it says.
func TestCompactDenial(t *testing.T) {
	const zone = "compact.test."
	soa := test.SOA(zone + " 300 IN SOA ns." + zone + " host." + zone + " 1 7200 3600 1209600 300")
	nsec := func(owner string, types ...uint16) *dns.NSEC {
		return &dns.NSEC{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeNSEC, Class: dns.ClassINET, Ttl: 300},
			NextDomain: "\\000." + owner, TypeBitMap: types}
	}
	nsec3 := func(name string, iterations uint16, types ...uint16) *dns.NSEC3 {
		return &dns.NSEC3{Hdr: dns.RR_Header{Name: strings.ToLower(dns.HashName(name, dns.SHA1, iterations, "")) + "." + zone, Rrtype: dns.TypeNSEC3, Class: dns.ClassINET, Ttl: 300},
			Hash: dns.SHA1, Iterations: iterations, HashLength: 20, NextDomain: "00000000000000000000000000000000", TypeBitMap: types}
	}
	cname := test.CNAME("a." + zone + " 300 IN CNAME gone." + zone)
	tests := []struct {
		name    string
		proof   dns.RR
		answer  []dns.RR
		disable bool // denials not cached: the reply goes out as the upstream sent it
		want    int  // the rcode a client without DO gets
	}{
		{"NXNAME", nsec("a."+zone, dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNXNAME), nil, false, dns.RcodeNameError},
		{"NXNAME, not cached", nsec("a."+zone, dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNXNAME), nil, true, dns.RcodeNameError},
		{"NXNAME in another name's NSEC", nsec("b."+zone, dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNXNAME), nil, false, dns.RcodeSuccess},
		{"a black lie without NXNAME", nsec("a."+zone, dns.TypeRRSIG, dns.TypeNSEC), nil, false, dns.RcodeSuccess},
		{"NXNAME in NSEC3", nsec3("a."+zone, 0, dns.TypeRRSIG, dns.TypeNXNAME), nil, false, dns.RcodeNameError},
		{"NXNAME in another name's NSEC3", nsec3("b."+zone, 0, dns.TypeRRSIG, dns.TypeNXNAME), nil, false, dns.RcodeSuccess},
		// Not hashed: a name's hash costs an iteration a round.
		{"NXNAME in NSEC3 of 151 iterations", nsec3("a."+zone, 151, dns.TypeRRSIG, dns.TypeNXNAME), nil, false, dns.RcodeSuccess},
		// A CNAME says the name exists, whatever its proof: NODATA.
		{"NXNAME beside a CNAME", nsec("a."+zone, dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNXNAME), []dns.RR{cname}, false, dns.RcodeSuccess},
	}
	for _, tc := range tests {
		u := newUpstream()
		u.add("a."+zone, dns.TypeA, dns.RcodeSuccess, tc.answer, []dns.RR{soa, tc.proof}, nil)
		c := newTestCache(t, u, newClock())
		if tc.disable {
			c.DisableDenial = []string{zone}
		}
		for i := range 2 { // from the upstream, then from the cache where stored
			plain := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
			if got := ask(t, c, plain, false); got.Rcode != tc.want || len(got.Answer) != len(tc.answer) || hasProof(got.Ns) {
				t.Errorf("%s, query %d without DO: %s with %d answers and NSEC %v, want %s without",
					tc.name, i, dns.RcodeToString[got.Rcode], len(got.Answer), hasProof(got.Ns), dns.RcodeToString[tc.want])
			}
			signed := test.Case{Qname: "a." + zone, Qtype: dns.TypeA, Do: true}.Msg()
			if got := ask(t, c, signed, false); got.Rcode != dns.RcodeSuccess || !hasProof(got.Ns) {
				t.Errorf("%s, query %d with DO: %s with NSEC %v, want NOERROR with it",
					tc.name, i, dns.RcodeToString[got.Rcode], hasProof(got.Ns))
			}
		}
		if stored := c.Stats().Entries; stored != map[bool]int64{false: 1, true: 0}[tc.disable] {
			t.Errorf("%s: %d entries", tc.name, stored)
		}
	}
}

// hasProof reports whether rrs hold an NSEC or NSEC3 record.
func hasProof(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if t := rr.Header().Rrtype; t == dns.TypeNSEC || t == dns.TypeNSEC3 {
			return true
		}
	}
	return false
}

// TestCompactDenialServedStale: a stale compact denial carries Extended DNS
// Error 19 (Stale NXDomain Answer), with NXDOMAIN for a client without DO.
func TestCompactDenialServedStale(t *testing.T) {
	const zone = "compact.test."
	u := newUpstream()
	u.add("a."+zone, dns.TypeA, dns.RcodeSuccess, nil, []dns.RR{
		test.SOA(zone + " 300 IN SOA ns." + zone + " host." + zone + " 1 7200 3600 1209600 300"),
		&dns.NSEC{Hdr: dns.RR_Header{Name: "a." + zone, Rrtype: dns.TypeNSEC, Class: dns.ClassINET, Ttl: 300},
			NextDomain: "\\000.a." + zone, TypeBitMap: []uint16{dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNXNAME}},
	}, nil)
	clk := newClock()
	c := parseCache(t, "compactcache {\n serve_stale 1h\n}", u, clk)
	req := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
	req.SetEdns0(1232, false)
	ask(t, c, req, false)
	u.set("a."+zone, dns.TypeA, nil) // the refresh fails: the stale entry stays
	clk.advance(time.Hour / 2)
	got := ask(t, c, req, false)
	if code, ok := ede(got); got.Rcode != dns.RcodeNameError || !ok || code != edeStaleNXDomain {
		t.Errorf("stale compact denial: %s with EDE %d (%v), want NXDOMAIN with EDE %d", dns.RcodeToString[got.Rcode], code, ok, edeStaleNXDomain)
	}
}
