package bench

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/compactcache/compactcache/internal/workload"

	"github.com/miekg/dns"
)

// Upstream is the server behind the cache. It answers the query for entry i
// with workload.Reply(i, Variant), i coming from the request's context
// (WithIndex), so that no name-to-index map sits on the heap while a cache is
// measured.
//
// Like forward, it hands the cache a message unpacked from wire bytes: every
// name its own string, every record its own allocation. The stock cache keeps
// that message's records, so its memory is measured as it is in production.
type Upstream struct {
	Variant workload.Variant
	// Replies, when set, answers entry i in place of workload.Reply: the
	// trace benchmark's one-off, denial and sized names.
	Replies func(i int) *dns.Msg
	calls   atomic.Int64
}

// ErrNoIndex is what a query without an entry index gets: hits are sent
// without one (Driver.Hit), so a hit that misses the cache fails loudly.
var ErrNoIndex = errors.New("upstream: query without an entry index (a hit query missed the cache)")

type indexKey struct{}

// WithIndex returns ctx carrying the entry index i for the upstream.
func WithIndex(ctx context.Context, i int) context.Context {
	return context.WithValue(ctx, indexKey{}, i)
}

// Name implements plugin.Handler.
func (u *Upstream) Name() string { return "upstream" }

// Calls returns the number of queries answered.
func (u *Upstream) Calls() int64 { return u.calls.Load() }

// ServeDNS implements plugin.Handler.
func (u *Upstream) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	i, ok := ctx.Value(indexKey{}).(int)
	if !ok {
		return dns.RcodeServerFailure, ErrNoIndex
	}
	u.calls.Add(1)
	var m *dns.Msg
	if u.Replies != nil {
		m = u.Replies(i)
	} else {
		m = workload.Reply(i, u.Variant)
	}
	m.Id = r.Id
	m.Question[0] = r.Question[0] // echoed as asked, as servers do
	m.CheckingDisabled = r.CheckingDisabled
	if o := r.IsEdns0(); o == nil || !o.Do() {
		// A signing server sends its signatures to DO queries only.
		m.Answer, m.Ns, m.Extra = unsigned(m.Answer), unsigned(m.Ns), unsigned(m.Extra)
	}
	b, err := m.Pack()
	if err != nil {
		return dns.RcodeServerFailure, err
	}
	m = new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		return dns.RcodeServerFailure, err
	}
	return dns.RcodeSuccess, w.WriteMsg(m)
}

// unsigned returns rrs without its RRSIG records, in place.
func unsigned(rrs []dns.RR) []dns.RR {
	kept := rrs[:0]
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeRRSIG {
			kept = append(kept, rr)
		}
	}
	return kept
}
