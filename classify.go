package compactcache

import (
	"time"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/reply"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/miekg/dns"
)

// verdict is what the miss path decides about an upstream reply.
type verdict struct {
	store   bool
	kind    int
	answers bool // a success that answers the question asked
	nxname  bool // a compact denial that the name exists (RFC 9824)
	ttl     time.Duration
	floor   time.Duration // MINTTL: no record is kept with a lower TTL
	why     string        // why it is not stored, for the debug line
	bad     bool          // not stored for being malformed or not what was asked: counted in drops
	erred   bool          // an error to response.Typify (expired signatures, NXDOMAIN with data): refreshes nothing
}

// unusable is the verdict on a reply that is malformed or does not answer
// the question asked.
func unusable(why string) verdict { return verdict{why: why, bad: true} }

// classify decides whether reply, the answer to req, is stored and for how
// long. It follows the stock cache: NOERROR with data and referrals are
// successes; NXDOMAIN and NODATA with an SOA, and SERVFAIL, are denials;
// truncated replies, other errors, zone transfers, updates and replies that
// do not answer the question asked are never stored.
func (c *Cache) classify(res, req *dns.Msg, now time.Time) verdict {
	switch {
	case res.Truncated:
		return unusable("truncated")
	case !reply.SameQuestion(res, req):
		return unusable("question does not match the request")
	case res.Opcode != dns.OpcodeQuery:
		return unusable("opcode is not QUERY")
	}
	sc := reply.Read(res, now)
	t := sc.Type(res)
	answers := t == response.NoError && len(res.Answer) > 0 && reply.Answers(res)
	if t == response.NoError && len(res.Answer) > 0 && !answers {
		// A CNAME chain that does not reach the queried type: NODATA when an
		// SOA bounds it (RFC 2308 2.2), an incomplete recursion otherwise
		// (RFC 2308 5: not cached).
		if !sc.SOA && reply.StartsChain(res) {
			return verdict{why: "CNAME chain does not reach the type"} // no drop: an answer, as in the stock cache
		}
		if !sc.SOA {
			return unusable("answer does not resolve the question")
		}
		t = response.NoData
	}
	var v verdict
	switch t {
	case response.NoError:
		v = verdict{kind: store.KindSuccess, answers: answers, ttl: clampTTL(sc.MinTTL(c.SuccessTTL, config.MinDefaultTTL, false), c.SuccessMinTTL, c.SuccessTTL), floor: c.SuccessMinTTL}
	case response.Delegation: // kept, its records served, for the minimum default TTL, as in the stock cache
		ttl := clampTTL(config.MinDefaultTTL, c.SuccessMinTTL, c.SuccessTTL)
		v = verdict{kind: store.KindSuccess, ttl: ttl, floor: ttl}
	case response.NameError, response.NoData:
		if !sc.SOA {
			return verdict{why: "denial without SOA"} // an answer, not cached (RFC 2308 5); no drop, as in the stock cache
		}
		v = verdict{kind: store.KindDenial, nxname: t == response.NoData && reply.CompactNXDomain(res), ttl: clampTTL(sc.MinTTL(c.DenialTTL, config.MinDefaultTTL, true), c.DenialMinTTL, c.DenialTTL), floor: c.DenialMinTTL}
	case response.ServerError:
		if res.Rcode != dns.RcodeServerFailure {
			return verdict{why: "rcode " + dns.RcodeToString[res.Rcode] + " is not cached"}
		}
		v = verdict{kind: store.KindDenial, ttl: c.ServfailTTL, floor: c.ServfailTTL} // its records served with its TTL, as in the stock cache
	case response.Meta, response.Update:
		return verdict{why: "zone transfers and updates are not cached"}
	default:
		return verdict{why: "rcode " + dns.RcodeToString[res.Rcode] + " is not cached", erred: true}
	}
	// A TTL of 0 (servfail 0, or TTL-0 records with MINTTL 0) is not stored;
	// a servfail under a second is, stale at once, as in the stock cache.
	if v.store = v.ttl > 0; !v.store {
		v.why = "TTL 0"
	}
	return v
}

func clampTTL(ttl, lo, hi time.Duration) time.Duration { return min(max(ttl, lo), hi) }
