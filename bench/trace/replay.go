package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"

	"github.com/miekg/dns"
)

// prepared is a trace with what the simulations need of it, computed once.
type prepared struct {
	*trace
	size  []int32 // the entry size of each query's name
	next  []int32 // the position of the next query of the same name, or never
	first []bool  // the query is its name's first
}

// sizes caches entry sizes across traces: they share the Zipf names.
type sizes struct {
	s     *sizer
	known map[uint32]int32
}

func prepare(t *trace, sz *sizes) *prepared {
	p := &prepared{trace: t, size: make([]int32, len(t.queries)), next: make([]int32, len(t.queries)), first: make([]bool, len(t.queries))}
	last := map[uint32]int32{}
	for pos, i := range t.queries {
		n, ok := sz.known[i]
		if !ok {
			n = int32(sz.s.size(int(i)))
			sz.known[i] = n
		}
		p.size[pos] = n
		p.next[pos] = never
		if prev, ok := last[i]; ok {
			p.next[prev] = int32(pos)
		} else {
			p.first[pos] = true
		}
		last[i] = int32(pos)
	}
	return p
}

// tally counts the hits of the counted part of a replay.
type tally struct {
	Queries, Hits       int
	HotQueries, HotHits int // the hottest 1% of names, their first queries left out
}

func (t tally) rate() float64    { return float64(t.Hits) / float64(max(1, t.Queries)) }
func (t tally) hotRate() float64 { return float64(t.HotHits) / float64(max(1, t.HotQueries)) }

func (t *tally) count(p *prepared, pos int, hit bool) {
	if pos < p.warmUp {
		return
	}
	t.Queries++
	if hit {
		t.Hits++
	}
	if p.hot(p.queries[pos]) && !p.first[pos] {
		t.HotQueries++
		if hit {
			t.HotHits++
		}
	}
}

// simulate replays p through a simulated policy.
func simulate(p *prepared, name string, budget int64) tally {
	pol := newPolicy(name, budget, p)
	var t tally
	for pos, key := range p.queries {
		t.count(p, pos, pol.access(pos, key, p.size[pos]))
	}
	return t
}

// result is a replay of a trace through a cache plugin.
type result struct {
	tally
	Entries int64 // compactcache: entries held at the end
	Bytes   int64 // compactcache: bytes its store holds at the end
}

// replay sends p's queries to c, one at a time, as a server would; a query
// that does not reach the upstream is a hit. Every 1,000th reply is checked
// against its question. mode.do percent of the queries set DO, the same ones
// in every replay.
func replay(p *prepared, c *bench.Cache, up *bench.Upstream, mode dnssecMode) (result, error) {
	var r result
	w := bench.NewWriter()
	w.Pack = false
	req := workload.NewRequest(0, workload.Plain)
	opt := req.IsEdns0()
	clients := rand.New(rand.NewPCG(22, uint64(mode.do)))
	for pos, i := range p.queries {
		q := question(int(i))
		workload.SetRequest(req, int(i), workload.Plain, q.Name)
		req.Question[0].Qtype = q.Qtype
		opt.SetDo(clients.IntN(100) < mode.do)
		calls := up.Calls()
		if _, err := c.ServeDNS(bench.WithIndex(context.Background(), int(i)), w, req); err != nil {
			return r, fmt.Errorf("query %d (%s): %v", pos, q.Name, err)
		}
		r.count(p, pos, up.Calls() == calls)
		if pos%1000 == 0 {
			if err := check(w, int(i), q); err != nil {
				return r, fmt.Errorf("query %d: %v", pos, err)
			}
		}
	}
	if c.Compact != nil {
		st := c.Compact.Stats()
		r.Entries, r.Bytes = st.Entries, st.Bytes
	}
	return r, nil
}

// check fails unless the last reply answers q, entry index i's question.
func check(w *bench.Writer, i int, q dns.Question) error {
	m, err := w.Reply()
	if err != nil {
		return err
	}
	if len(m.Question) != 1 || m.Question[0] != q {
		return fmt.Errorf("reply to %v for %v", m.Question, q)
	}
	want := dns.RcodeSuccess
	if i >= denialBase && i < sizedBase {
		want = dns.RcodeNameError
	}
	// A reply over the client's 4,096 bytes comes truncated, without records.
	if m.Rcode != want || !m.Truncated && (want == dns.RcodeSuccess) != (len(m.Answer) > 0) {
		return fmt.Errorf("%v: rcode %s", q, dns.RcodeToString[m.Rcode])
	}
	return nil
}

// newCache returns the plugin kind in front of an upstream that answers the
// trace's names: compactcache with capacity budget, the stock cache with
// budget / stockBytes entries.
func newCache(kind bench.Kind, budget int64, stockBytes int, mode dnssecMode) (*bench.Cache, *bench.Upstream, error) {
	up := &bench.Upstream{Replies: mode.replies()}
	var (
		c   *bench.Cache
		err error
	)
	if kind == bench.Stock {
		c, err = bench.NewStock(int(budget)/stockBytes, up)
	} else {
		c, err = bench.NewCompact(budget, up)
		if err == nil {
			c.Compact.SetRawWrites(true)
		}
	}
	return c, up, err
}
