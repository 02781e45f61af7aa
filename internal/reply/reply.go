// Package reply reads an upstream reply for the cache's decision to store
// it: the stock cache's classification (response.Typify) in one pass over
// the records, the TTLs that bound an entry (RFC 2308), whether an answer
// resolves its question through its CNAME chain (RFC 1034 3.6.2), and
// compact denials (RFC 9824).
package reply

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/miekg/dns"
)

// SameQuestion reports whether reply is a response to the question of req.
func SameQuestion(reply, req *dns.Msg) bool {
	if len(reply.Question) != 1 || len(req.Question) != 1 || !reply.Response {
		return false
	}
	a, b := reply.Question[0], req.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && SameName(a.Name, b.Name)
}

// Scan is what a reply's records say for its classification, read in one
// pass over them rather than one for each question asked of them.
type Scan struct {
	SOA     bool // an SOA in the authority section
	ns      int  // NS records in the authority section
	expired bool // a signature outside its validity period, in a DO reply
	records bool // any record but OPT and TSIG, wherever they stand
	// The smallest TTLs of the records clients without DO get, of those
	// only DO clients get (dnssecOnly), and the smallest SOA MINIMUM.
	dataTTL, proofTTL, soaMinimum uint32
}

// Read scans m, at now for the validity of its signatures.
func Read(m *dns.Msg, now time.Time) Scan {
	sc := Scan{dataTTL: math.MaxUint32, proofTTL: math.MaxUint32, soaMinimum: math.MaxUint32}
	opt := m.IsEdns0()
	do := opt != nil && opt.Do()
	qtype := m.Question[0].Qtype
	for section, rrs := range [3][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, r := range rrs {
			h := r.Header()
			switch h.Rrtype {
			case dns.TypeSOA:
				sc.SOA = sc.SOA || section == 1
			case dns.TypeNS:
				if section == 1 {
					sc.ns++
				}
			case dns.TypeRRSIG:
				if sig, ok := r.(*dns.RRSIG); ok && do && !sig.ValidityPeriod(now) {
					sc.expired = true
				}
			}
			if entry.HopByHop(h.Rrtype) {
				continue
			}
			sc.records = true
			ttl := dnsmsg.WireTTL(h.Ttl)
			if sig, ok := r.(*dns.RRSIG); ok {
				ttl = min(ttl, entry.ValidFor(sig, uint32(now.Unix()))) // as Build keeps it (RFC 4035 5.3.3)
			}
			if entry.DNSSECOnly(h.Rrtype, section) && !entry.AskedFor(h.Rrtype, section, qtype) {
				sc.proofTTL = min(sc.proofTTL, ttl)
			} else {
				sc.dataTTL = min(sc.dataTTL, ttl)
			}
			if soa, ok := r.(*dns.SOA); ok {
				sc.soaMinimum = min(sc.soaMinimum, dnsmsg.WireTTL(soa.Minttl))
			}
		}
	}
	return sc
}

// CompactNXDomain reports whether m is a compact denial of its question's
// name (RFC 9824): NOERROR without data, an SOA, and the name's NSEC or
// NSEC3 with NXNAME in its type bitmap, the sign that the name does not
// exist. A client without DO, which gets none of the proof, gets NXDOMAIN,
// as section 5 has resolvers restore it: the upstream was asked with DO.
func CompactNXDomain(m *dns.Msg) bool {
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) > 0 || len(m.Question) != 1 {
		return false
	}
	soa, proof := false, false
	for _, rr := range m.Ns {
		switch rr := rr.(type) {
		case *dns.SOA:
			soa = true
		case *dns.NSEC:
			proof = proof || slices.Contains(rr.TypeBitMap, dns.TypeNXNAME) && SameName(rr.Hdr.Name, m.Question[0].Name)
		case *dns.NSEC3:
			// The bitmap first, and few iterations (RFC 9276 section 3.2):
			// hashing the name costs an iteration a round.
			proof = proof || slices.Contains(rr.TypeBitMap, dns.TypeNXNAME) && rr.Iterations <= maxNSEC3Iterations && rr.Match(m.Question[0].Name)
		}
	}
	return soa && proof
}

// maxNSEC3Iterations is the most NSEC3 iterations a proof is hashed for; RFC
// 9276 has validators treat more as insecure, and compact denials use 0.
const maxNSEC3Iterations = 150

// Type is response.Typify, the stock cache's classification, for a QUERY
// reply with one question (classify has checked both), from the scan: the
// same decisions in the same order, without its passes over the records.
func (sc *Scan) Type(m *dns.Msg) response.Type {
	switch qtype := m.Question[0].Qtype; {
	case qtype == dns.TypeAXFR || qtype == dns.TypeIXFR:
		return response.Meta
	case sc.expired:
		return response.OtherError
	case len(m.Answer) > 0 && m.Rcode == dns.RcodeSuccess:
		return response.NoError
	case len(m.Answer) > 0 && m.Rcode == dns.RcodeNameError:
		return response.OtherError
	case sc.SOA && m.Rcode == dns.RcodeSuccess:
		return response.NoData
	case m.Rcode == dns.RcodeNameError:
		return response.NameError
	case m.Rcode == dns.RcodeServerFailure || m.Rcode == dns.RcodeNotImplemented:
		return response.ServerError
	case sc.ns > 0 && m.Rcode == dns.RcodeSuccess:
		return response.Delegation
	case m.Rcode == dns.RcodeSuccess:
		return response.NoError
	}
	return response.OtherError
}

// Answers reports whether the answer section holds the queried type
// at the end of the CNAME chain that starts at the question's name (RFC 1034
// 3.6.2), as the stock cache's answersQuestion does: only at its end, since an
// alias has no other data. A chain with a loop or an owner of two targets
// answers nothing (RFC 2181 10.1), nor does a CNAME question's alias of two.
func Answers(m *dns.Msg) bool {
	q := m.Question[0]
	name := q.Name
	switch q.Qtype {
	case dns.TypeANY:
		return ownerHas(m.Answer, name, q.Qtype, q.Qclass)
	case dns.TypeCNAME:
		target, ok := cnameTarget(m.Answer, name, q.Qclass)
		return ok && target != ""
	}
	for hops := 0; hops <= len(m.Answer); hops++ {
		target, ok := cnameTarget(m.Answer, name, q.Qclass)
		if !ok {
			return false
		}
		if target == "" {
			return ownerHas(m.Answer, name, q.Qtype, q.Qclass)
		}
		name = target
	}
	return false // longer than the answer: a loop
}

// StartsChain reports whether the answer section holds a CNAME at the
// question's name: a reply that Answers rejects is then a chain that stops
// short of the type (an incomplete recursion, RFC 2308 5), not an answer to
// another question.
func StartsChain(m *dns.Msg) bool {
	q := m.Question[0]
	return ownerHas(m.Answer, q.Name, dns.TypeCNAME, q.Qclass)
}

// ownerHas reports whether rrs has a record of type t (any type for ANY) at
// name in class.
func ownerHas(rrs []dns.RR, name string, t, class uint16) bool {
	for _, r := range rrs {
		h := r.Header()
		if (t == dns.TypeANY || h.Rrtype == t) && classMatches(h.Class, class) && SameName(h.Name, name) {
			return true
		}
	}
	return false
}

// cnameTarget returns the target of owner's CNAME, "" when it has none, and
// false when it has two different ones (RFC 2181 10.1).
func cnameTarget(rrs []dns.RR, owner string, class uint16) (string, bool) {
	target := ""
	for _, r := range rrs {
		c, ok := r.(*dns.CNAME)
		if !ok || !classMatches(c.Hdr.Class, class) || !SameName(c.Hdr.Name, owner) {
			continue
		}
		if target != "" && !SameName(target, c.Target) {
			return "", false
		}
		target = c.Target
	}
	return target, true
}

// SameName reports whether two names in presentation form are equal, case
// aside. Names that are the same string, most of a reply's, compare at
// memory speed; strings.EqualFold walks them rune by rune.
func SameName(a, b string) bool { return a == b || strings.EqualFold(a, b) }

func classMatches(rrClass, qclass uint16) bool { return qclass == dns.ClassANY || rrClass == qclass }

// MinTTL returns the entry's TTL, at most ceiling: the smallest TTL of the
// records every client gets. The DNSSEC records only DO clients get keep
// their own, shorter TTLs, which the lookup reads for DO clients (see
// entry.ProofTTL): records a client does not receive must not shorten what
// it receives. For a denial, an SOA's MINIMUM bounds it too (RFC 2308 5;
// the stock cache ignores MINIMUM); it does not bound positive answers. A
// reply without records gets fallback.
func (sc *Scan) MinTTL(ceiling, fallback time.Duration, denial bool) time.Duration {
	if !sc.records {
		return fallback
	}
	ttl := sc.dataTTL
	if ttl == math.MaxUint32 {
		ttl = sc.proofTTL // nothing but DNSSEC records
	}
	if denial {
		ttl = min(ttl, sc.soaMinimum)
	}
	return time.Duration(min(uint32(ceiling/time.Second), ttl)) * time.Second
}
