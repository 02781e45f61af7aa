package bench

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/workload"

	"github.com/coredns/coredns/plugin"
)

// Fill is kept small so that `go test -bench .` stays quick; the report
// command measures at 1M and 10M entries.
var (
	entries  = flag.Int("entries", 100_000, "entries stored before BenchmarkHit measures")
	capacity = flag.Int64("capacity", 512<<20, "compactcache's byte budget")
)

// newCache returns kind in front of up, big enough to hold every entry the
// benchmarks store.
func newCache(tb testing.TB, kind Kind, up *Upstream) *Cache {
	tb.Helper()
	var c *Cache
	var err error
	switch kind {
	case Stock:
		c, err = NewStock(4*max(*entries, 1<<20), up)
	case Compact:
		c, err = NewCompact(*capacity, up)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// BenchmarkHit measures a hit through ServeDNS with the reply written and
// packed, keys uniform over the stored entries, their names built in batches
// with the timer stopped (see Batch).
func BenchmarkHit(b *testing.B) {
	for _, bc := range []struct {
		name string
		kind Kind
		raw  bool
	}{
		{"stock", Stock, false},
		{"compactcache", Compact, false},
		{"compactcache-raw", Compact, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			up := &Upstream{}
			c := newCache(b, bc.kind, up)
			if c.Compact != nil {
				c.Compact.SetRawWrites(bc.raw)
			}
			d := NewDriver(workload.Plain, workload.NewNames(*entries))
			for i := range *entries {
				if err := d.Query(c, i); err != nil {
					b.Fatal(err)
				}
			}
			// As the report times hits: on the huge pages the fill left
			// pending.
			HugePagesMade(time.Minute)
			calls := up.Calls()
			if err := d.Hit(c, 0); err != nil {
				b.Fatalf("%s does not hold entry 0: %v", bc.name, err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			batch := new(Batch)
			j := BatchLen
			b.ReportAllocs()
			for b.Loop() {
				if j == BatchLen {
					b.StopTimer()
					batch.Fill(r, *entries)
					j = 0
					b.StartTimer()
				}
				if err := d.HitBatch(c, batch, j); err != nil {
					b.Fatal(err)
				}
				j++
			}
			if n := up.Calls() - calls; n != 0 {
				b.Fatalf("%d hits reached the upstream", n)
			}
		})
	}
}

// BenchmarkInsert measures a miss that stores a new entry: the upstream's own
// cost is the "upstream" sub-benchmark, to subtract. compactcache-raw writes
// the client's reply as bytes, as a block of raw-safe plugins does.
func BenchmarkInsert(b *testing.B) {
	for _, name := range []string{"upstream", "stock", "compactcache", "compactcache-raw"} {
		b.Run(name, func(b *testing.B) {
			up := &Upstream{}
			var h plugin.Handler = up
			switch name {
			case "stock":
				h = newCache(b, Stock, up)
			case "compactcache", "compactcache-raw":
				c := newCache(b, Compact, up)
				c.Compact.SetRawWrites(name == "compactcache-raw")
				h = c
			}
			d := NewDriver(workload.Plain, nil)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Query(h, i); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
