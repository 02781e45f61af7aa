package main

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"
)

// walkClient is the client of the walk row: 2001:db8:0:1::/56 (workload
// client 3).
var walkClient = workload.Subnet(3)

// walkSubnet returns the /56 that differs from walkClient first at bit
// l-1: the upstream scopes its answer /l, so the variant stored for it sits
// at length l and never serves walkClient.
func walkSubnet(l int) netip.Prefix {
	a := walkClient.Addr().As16()
	a[(l-1)/8] ^= 0x80 >> ((l - 1) % 8)
	return netip.PrefixFrom(netip.AddrFrom16(a), walkClient.Bits())
}

// walkScope is the upstream's scope in the walk row: 0 for walkClient, and
// for any other address the position of its first bit that differs from
// walkClient's, plus one.
func walkScope(family uint16, addr netip.Addr) uint8 {
	if family != 2 {
		return geoScope(family, addr)
	}
	a, c := addr.As16(), walkClient.Addr().As16()
	for b := range 128 {
		if a[b/8]&(0x80>>(b%8)) != c[b/8]&(0x80>>(b%8)) {
			return uint8(b + 1)
		}
	}
	return 0
}

// lookupRow is one row of figure 3: a filled cache and how to pick a hit.
type lookupRow struct {
	label    string
	names, k int
	c        *bench.Cache
	cl       *client
	pick     func(*rand.Rand) (int, netip.Prefix)
	next     upstream
	rounds   []cost
	bytes    int64
}

// median returns the median of the rounds' figures, each taken apart.
func (r *lookupRow) median() cost {
	med := func(get func(cost) float64) float64 {
		s := make([]float64, len(r.rounds))
		for i, c := range r.rounds {
			s[i] = get(c)
		}
		slices.Sort(s)
		return s[len(s)/2]
	}
	return cost{
		ns:     med(func(c cost) float64 { return c.ns }),
		cpuNs:  med(func(c cost) float64 { return c.cpuNs }),
		allocs: med(func(c cost) float64 { return c.allocs }),
	}
}

// minimum returns the round with the least thread CPU time.
func (r *lookupRow) minimum() cost {
	return slices.MinFunc(r.rounds, func(a, b cost) int { return cmp.Compare(a.cpuNs, b.cpuNs) })
}

// lookupRounds is how many times each row is timed, the rows taking turns,
// so that a burst of load on a shared machine hits one round of every row
// rather than all of one row.
const lookupRounds = 10

// lookupFigure prints figure 3: compactcache holding about N entries in
// each row (N names plain or with one variant, N/10 names with 10 variants,
// N/100 with 100), hits uniform over the (name, stored subnet) pairs, the
// client's subnet being that of a stored variant (the longest, and here only,
// length that matches it). Raw writes; the request is rewritten for every
// hit (workload.SetRequest and the subnet), as in bench's hit figures.
func lookupFigure(cfg config, names *workload.Names) error {
	var rows []*lookupRow
	plain, err := lookupFill(cfg, names, "plain (no ECS)", workload.Plain, cfg.n, 1, false)
	if err != nil {
		return err
	}
	rows = append(rows, plain)
	for _, k := range []int{1, 10, 100} {
		r, err := lookupFill(cfg, names, fmt.Sprintf("ecs, %d variant(s) per name", k), workload.ECS, cfg.n/k, k, false)
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}
	walk, err := lookupFill(cfg, names, "ecs walk: 57 variants at /56../1 and /0, hit matching only /0", workload.ECS, cfg.n/57, 57, true)
	if err != nil {
		return err
	}
	rows = append(rows, walk)

	per := max(1, cfg.hits/lookupRounds)
	progress("lookup: timing %d rounds of %d hits per row", lookupRounds, per)
	for round := range lookupRounds {
		for _, r := range rows {
			rnd := newRand(uint64(4 + round))
			calls := r.next.Calls()
			runtime.GC()
			hit, err := loop(per, func(int) error {
				i, p := r.pick(rnd)
				return r.cl.hit(r.c, i, p)
			})
			if err != nil {
				return err
			}
			if r.next.Calls() != calls {
				return fmt.Errorf("%s: %d timed hits missed", r.label, r.next.Calls()-calls)
			}
			r.rounds = append(r.rounds, hit)
		}
	}

	base, baseMin := plain.median(), plain.minimum()
	fmt.Printf("## 3. Hit cost by variants per name (compactcache, ServeDNS, raw writes; %d rounds of %d hits, rows taking turns)\n\n", lookupRounds, per)
	fmt.Println("CPU ns/op is the CPU time of the thread that sent the hits (the loop allocates nothing, so no GC work runs elsewhere), which leaves out the time other processes held the CPU; wall ns/op counts it.")
	fmt.Println()
	fmt.Println("| stored | names | entries | Stats().Bytes | CPU ns/op, median | CPU ns/op, min | wall ns/op, median | allocs/op | CPU / plain (median) | CPU / plain (min) | wall / plain |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		m, lo := r.median(), r.minimum()
		fmt.Printf("| %s | %d | %d | %.1f MiB | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f |\n", r.label, r.names, r.names*r.k,
			float64(r.bytes)/(1<<20), m.cpuNs, lo.cpuNs, m.ns, m.allocs, m.cpuNs/base.cpuNs, lo.cpuNs/baseMin.cpuNs, m.ns/base.ns)
	}
	fmt.Println()
	fmt.Println("Wall ns/op of every round:")
	fmt.Println()
	for _, r := range rows {
		var all []string
		for _, c := range r.rounds {
			all = append(all, fmt.Sprintf("%.0f", c.ns))
		}
		fmt.Printf("- %s: %s\n", r.label, strings.Join(all, " "))
	}
	fmt.Println()
	for _, r := range rows {
		runtime.KeepAlive(r.c)
	}
	return nil
}

// lookupFill fills compactcache with names names of variant v, each asked
// from k subnets, and checks a sample of hits. In the walk row the k subnets
// are walkSubnet(56..1) and walkClient last, answered by walkScope, and every
// hit comes from walkClient.
func lookupFill(cfg config, names *workload.Names, label string, v workload.Variant, nNames, k int, walk bool) (*lookupRow, error) {
	up := newGeoUpstream()
	if walk {
		up.scope = walkScope
	}
	var next upstream = up
	if v&workload.ECS == 0 {
		next = up.up
		up.up.Variant = workload.Plain
	}
	c, err := newCompact(capacityFor(cfg.n*cfg.k), 0, next)
	if err != nil {
		return nil, err
	}
	cl := newClient(v, names)
	subnet := func(i, t int) (int, netip.Prefix) {
		if !walk {
			return variantSubnet(i, t)
		}
		if t == k-1 {
			return 3, walkClient
		}
		return -1, walkSubnet(56 - t)
	}
	progress("lookup: %s, %d names", label, nNames)
	for t := range k {
		for i := range nNames {
			_, p := subnet(i, t)
			if err := cl.query(c, i, p); err != nil {
				return nil, err
			}
		}
	}
	st := c.Compact.Stats()
	if want := int64(nNames * k); st.Entries != want || next.Calls() != want {
		return nil, fmt.Errorf("%s: %d entries, %d upstream queries, want %d", label, st.Entries, next.Calls(), want)
	}
	pick := func(rnd *rand.Rand) (int, int, netip.Prefix) {
		i := rnd.IntN(nNames)
		if walk {
			return i, 3, walkClient
		}
		j, p := subnet(i, rnd.IntN(k))
		return i, j, p
	}

	// Check a sample of hits: each must be the stored subnet's own answer.
	rnd := newRand(3)
	for range 10_000 {
		i, j, p := pick(rnd)
		if err := cl.hit(c, i, p); err != nil {
			return nil, fmt.Errorf("%s: entry %d from %s: %v", label, i, p, err)
		}
		if v&workload.ECS == 0 {
			continue
		}
		tag, err := cl.tag()
		if err != nil {
			return nil, err
		}
		if tag != j {
			return nil, fmt.Errorf("%s: entry %d from %s: reply for subnet %d", label, i, p, tag)
		}
	}
	return &lookupRow{
		label: label, names: nNames, k: k, c: c, cl: cl, next: next, bytes: st.Bytes,
		pick: func(rnd *rand.Rand) (int, netip.Prefix) {
			i, _, p := pick(rnd)
			return i, p
		},
	}, nil
}
