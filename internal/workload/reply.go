package workload

import (
	"encoding/base64"
	"net"
	"strings"

	"github.com/miekg/dns"
)

const (
	// TTL is every record's TTL.
	TTL = 3600
	// UDPSize is the EDNS buffer size of requests and replies. The largest
	// entry of all variants together (four 224-byte TXT records behind a
	// signed CNAME) passes the flag day's 1232 bytes; at 4096 no reply is
	// truncated, so that every cache serves every entry whole.
	UDPSize = 4096
	// cnamePercent of the entries go through a CNAME in the cname variant.
	cnamePercent = 15
	// Fixed signature validity: the signatures are random bytes and nobody
	// validates them, but their size is that of real ones.
	sigInception  = 1767225600 // 2026-01-01
	sigExpiration = 1798761600 // 2027-01-01
	sigBytes      = 64         // ECDSA P-256: r and s, 32 bytes each
)

// txtAlphabet has no character that presentation form escapes, so a string's
// wire size is its length plus one.
const txtAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// Reply returns the reply an authoritative upstream gives for entry i: the
// question, the records, and an OPT record (with the client's subnet and its
// scope in the ecs variant). Its ID is 0: the caller sets the request's.
func Reply(i int, v Variant) *dns.Msg {
	r := newRNG(domainEntry, i)
	qtype := qtypeOf(&r)
	name := string(appendName(make([]byte, 0, 48), i, &r))

	m := new(dns.Msg)
	m.Response = true
	m.RecursionDesired = true
	m.RecursionAvailable = true
	m.Question = []dns.Question{{Name: name, Qtype: qtype, Qclass: dns.ClassINET}}

	owner := name
	if v&CNAME != 0 {
		if target, ok := cnameTarget(i); ok {
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: header(name, dns.TypeCNAME), Target: target})
			if v&DNSSEC != 0 {
				m.Answer = append(m.Answer, rrsig(i, 0, name, dns.TypeCNAME))
			}
			owner = target
		}
	}
	m.Answer = appendRecords(m.Answer, &r, owner, qtype)
	if v&DNSSEC != 0 {
		m.Answer = append(m.Answer, rrsig(i, 1, owner, qtype))
	}

	o := newOPT(v)
	if v&ECS != 0 {
		e := o.Option[0].(*dns.EDNS0_SUBNET)
		setSubnet(e, Client(i))
		e.SourceScope = e.SourceNetmask
	}
	m.Extra = []dns.RR{o}
	return m
}

func header(owner string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: owner, Rrtype: t, Class: dns.ClassINET, Ttl: TTL}
}

// appendRecords appends 1 to 4 records of type t owned by owner, continuing
// entry i's stream after its name.
func appendRecords(rrs []dns.RR, r *rng, owner string, t uint16) []dns.RR {
	n := 1 + r.intn(4)
	for range n {
		switch t {
		case dns.TypeA:
			ip := make(net.IP, net.IPv4len)
			for k := range ip {
				ip[k] = byte(r.next())
			}
			rrs = append(rrs, &dns.A{Hdr: header(owner, t), A: ip})
		case dns.TypeAAAA:
			ip := make(net.IP, net.IPv6len)
			for k := range ip {
				ip[k] = byte(r.next())
			}
			rrs = append(rrs, &dns.AAAA{Hdr: header(owner, t), AAAA: ip})
		case dns.TypeTXT:
			// One string: its length byte plus 63..223 characters make
			// 64..224 bytes of rdata.
			b := make([]byte, 63+r.intn(161))
			for k := range b {
				b[k] = txtAlphabet[r.intn(len(txtAlphabet))]
			}
			rrs = append(rrs, &dns.TXT{Hdr: header(owner, t), Txt: []string{string(b)}})
		}
	}
	return rrs
}

// cnameTarget returns the name entry i is an alias of in the cname variant.
func cnameTarget(i int) (string, bool) {
	r := newRNG(domainCNAME, i)
	if r.intn(100) >= cnamePercent {
		return "", false
	}
	b := r.letters(make([]byte, 0, 48), 6+r.intn(15))
	b = append(b, '.')
	return string(append(b, slds[r.intn(NumSLDs)]...)), true
}

// rrsig returns the signature of entry i's RRset number set, owned by owner,
// as the second-level domain above owner would sign it.
func rrsig(i, set int, owner string, covered uint16) *dns.RRSIG {
	r := newRNG(domainSig, 2*i+set)
	sig := make([]byte, sigBytes)
	for k := range sig {
		sig[k] = byte(r.next())
	}
	return &dns.RRSIG{
		Hdr:         header(owner, dns.TypeRRSIG),
		TypeCovered: covered,
		Algorithm:   dns.ECDSAP256SHA256,
		Labels:      uint8(dns.CountLabel(owner)),
		OrigTtl:     TTL,
		Expiration:  sigExpiration,
		Inception:   sigInception,
		KeyTag:      uint16(r.next()),
		SignerName:  owner[strings.IndexByte(owner, '.')+1:],
		Signature:   base64.StdEncoding.EncodeToString(sig),
	}
}
