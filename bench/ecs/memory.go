package main

import (
	"fmt"
	"net/netip"
	"runtime"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// fill is one cache filled with N names, each asked from k subnets.
type fill struct {
	kind                 bench.Kind
	variant              workload.Variant
	k                    int
	heapInuse, heapAlloc float64 // bytes, after GC, minus before the fill
	storeBytes           float64 // compactcache's Stats().Bytes, minus empty
	entries              int64   // compactcache's Stats().Entries
	calls                int64   // upstream queries
	hits, wrong          int     // verification: replies, and those for another subnet
}

type upstream interface {
	plugin.Handler
	Calls() int64
}

// fillCache builds kind, asks each of the N names from k subnets (t outer,
// so that a name's variants arrive apart, as real clients' would), measures
// the memory held, then asks every (name, subnet) again (every fifth name
// when k > 1) and checks which subnet each reply was made for.
func fillCache(cfg config, names *workload.Names, kind bench.Kind, v workload.Variant, k int) (*fill, error) {
	var up upstream = &bench.Upstream{Variant: v}
	if v&workload.ECS != 0 {
		up = newGeoUpstream()
	}
	var c *bench.Cache
	var err error
	if kind == bench.Stock {
		c, err = bench.NewStock(2*cfg.n, up) // twice: its random eviction never runs
	} else {
		c, err = newCompact(capacityFor(cfg.n*cfg.k), 0, up)
	}
	if err != nil {
		return nil, err
	}
	cl := newClient(v, names)
	f := &fill{kind: kind, variant: v, k: k}
	progress("%s %s: %d names x %d subnets", kind, v, cfg.n, k)

	var empty int64
	if c.Compact != nil {
		empty = c.Compact.Stats().Bytes
	}
	before := bench.Settled()
	for t := range k {
		for i := range cfg.n {
			_, p := variantSubnet(i, t)
			if err := cl.query(c, i, p); err != nil {
				return nil, err
			}
		}
	}
	after := bench.Settled()
	f.heapInuse = float64(after.HeapInuse) - float64(before.HeapInuse)
	f.heapAlloc = float64(after.HeapAlloc) - float64(before.HeapAlloc)
	f.calls = up.Calls()
	if c.Compact != nil {
		st := c.Compact.Stats()
		f.storeBytes = float64(st.Bytes - empty)
		f.entries = st.Entries
		if want := int64(cfg.n * k); st.Entries != want || f.calls != want {
			return nil, fmt.Errorf("%s %s k=%d: %d entries stored, %d upstream queries, want %d", kind, v, k, st.Entries, f.calls, want)
		}
	}

	calls := up.Calls()
	step := 1
	if k > 1 {
		step = 5 // every fifth name, from each of its k subnets
	}
	for t := range k {
		for i := 0; i < cfg.n; i += step {
			j, p := variantSubnet(i, t)
			if err := cl.hit(c, i, p); err != nil {
				return nil, fmt.Errorf("%s %s: entry %d from subnet %s: %v", kind, v, i, p, err)
			}
			f.hits++
			if v&workload.ECS == 0 {
				continue
			}
			m, err := cl.w.Reply()
			if err != nil {
				return nil, err
			}
			if tag := replyTag(m, cl.req.Question[0].Qtype); tag != j {
				f.wrong++
			}
			if c.Compact != nil {
				if err := checkEcho(m, p); err != nil {
					return nil, fmt.Errorf("%s entry %d from %s: %v", kind, i, p, err)
				}
			}
		}
	}
	if up.Calls() != calls {
		return nil, fmt.Errorf("%s %s: %d verification queries missed", kind, v, up.Calls()-calls)
	}
	runtime.KeepAlive(c)
	return f, nil
}

// checkEcho checks that a hit's ECS option is the client's own with the
// workload's scope.
func checkEcho(m *dns.Msg, p netip.Prefix) error {
	e := subnetOf(m)
	if e == nil {
		return fmt.Errorf("reply without ECS")
	}
	want := geoScope(e.Family, netip.Addr{})
	if addrOf(e) != p.Addr() || int(e.SourceNetmask) != p.Bits() || e.SourceScope != want {
		return fmt.Errorf("ECS echoed as %s, want %s scope %d", e, p, want)
	}
	return nil
}

// memoryFigure prints figure 1 and returns the stock cache's heap bytes per
// ECS entry, which sizes it for the hit-rate figure.
func memoryFigure(cfg config, names *workload.Names) (float64, error) {
	payload := 0
	for i := range cfg.n {
		payload += workload.Payload(i)
	}
	n := float64(cfg.n)

	type row struct{ plain, one, many *fill }
	rows := map[bench.Kind]row{}
	for _, kind := range []bench.Kind{bench.Compact, bench.Stock} {
		var r row
		var err error
		if r.plain, err = fillCache(cfg, names, kind, workload.Plain, 1); err != nil {
			return 0, err
		}
		if r.one, err = fillCache(cfg, names, kind, workload.ECS, 1); err != nil {
			return 0, err
		}
		if r.many, err = fillCache(cfg, names, kind, workload.ECS, cfg.k); err != nil {
			return 0, err
		}
		rows[kind] = r
	}

	k := cfg.k
	fmt.Printf("## 1. Bytes per ECS variant (N = %d names, payload %.1f bytes per entry)\n\n", cfg.n, float64(payload)/n)
	fmt.Printf("Each name is asked from k client subnets of one family (clients Client(i)+2t, t < k); the upstream answers each subnet with its own records, scope /24 or /56.\n")
	fmt.Printf("Per entry: bytes held after the fill over N. Marginal: (bytes with k = %d variants per name - bytes with 1) / (N*(k-1)).\n\n", k)
	fmt.Println("| cache | measure | plain, per entry | ecs k=1, per name | ecs marginal, per extra variant | ecs / plain |")
	fmt.Println("|---|---|--:|--:|--:|--:|")
	for _, kind := range []bench.Kind{bench.Compact, bench.Stock} {
		r := rows[kind]
		type measure struct {
			name string
			get  func(*fill) float64
		}
		ms := []measure{
			{"HeapInuse", func(f *fill) float64 { return f.heapInuse }},
			{"HeapAlloc", func(f *fill) float64 { return f.heapAlloc }},
		}
		if kind == bench.Compact {
			ms = append([]measure{{"Stats().Bytes", func(f *fill) float64 { return f.storeBytes }}}, ms...)
		}
		for _, m := range ms {
			plain, one := m.get(r.plain)/n, m.get(r.one)/n
			marginal := (m.get(r.many) - m.get(r.one)) / (n * float64(k-1))
			fmt.Printf("| %s | %s | %.1f | %.1f | %.1f | %.2f |\n", kind, m.name, plain, one, marginal, marginal/plain)
		}
	}
	dead := 0.0
	for i := range cfg.n {
		dead += deadListBytes(len(names.Name(i))+1, workload.Subnet(workload.Client(i)).Bits(), k)
	}
	dead /= n * float64(k-1)
	m := rows[bench.Compact]
	live := (m.many.storeBytes-m.one.storeBytes)/(n*float64(k-1)) - dead
	fmt.Printf("\nOf compactcache's marginal, %.1f bytes per extra variant are copies of the name's variant list left dead in the arena: each new variant rewrites the whole list (withVariant, ecs.go), and the store appends the new copy, leaving the old one until the ring reclaims its chunk. Computed from the list's format, not measured; the rest, %.1f bytes (%.2f of a plain entry's Stats().Bytes), is the variant itself, its index slot and its item in the list.\n", dead, live, live/(m.plain.storeBytes/n))
	fmt.Println()
	fmt.Println("| cache | fill | upstream queries | replies checked | replies for another subnet |")
	fmt.Println("|---|---|--:|--:|--:|")
	for _, kind := range []bench.Kind{bench.Compact, bench.Stock} {
		r := rows[kind]
		for _, f := range []*fill{r.plain, r.one, r.many} {
			fmt.Printf("| %s | %s k=%d | %d | %d | %d |\n", kind, f.variant, f.k, f.calls, f.hits, f.wrong)
		}
	}
	fmt.Println()
	return rows[bench.Stock].one.heapInuse / n, nil
}

// deadListBytes returns the bytes of the variant lists a name with k
// variants leaves dead in the arena, each of its first k-1 lists having been
// replaced by a list one item longer. A list is an entry: the 25-byte
// header, the key (the wire qname, qtype, qclass and flags, then the
// family), a 17-byte bitmap of prefix lengths, and per variant its exact
// flag, prefix length and masked address (ecs.go).
func deadListBytes(wireName, prefix, k int) float64 {
	item := 2 + (prefix+7)/8
	base := 25 + wireName + 5 + 1 + 17
	total := 0
	for v := 1; v < k; v++ {
		total += base + v*item
	}
	return float64(total)
}
