package bench

import (
	"testing"

	"github.com/compactcache/compactcache/bench/workload"
)

// TestCaches stores entries of every variant in both caches and checks that
// each one comes back whole: the harness works, and compactcache answers the
// workload as the stock cache does.
func TestCaches(t *testing.T) {
	const n = 3000
	for _, v := range []workload.Variant{workload.Plain, workload.CNAME | workload.DNSSEC | workload.ECS} {
		for _, kind := range []Kind{Stock, Compact} {
			for _, raw := range []bool{false, true} {
				if raw && kind == Stock {
					continue
				}
				up := &Upstream{Variant: v}
				c := newCache(t, kind, up)
				if c.Compact != nil {
					c.Compact.SetRawWrites(raw)
				}
				d := NewDriver(v, workload.NewNames(n))
				for i := range n {
					if err := d.Query(c, i); err != nil {
						t.Fatalf("%s, %s: insert %d: %v", kind, v, i, err)
					}
				}
				if _, err := Verify(c, d, up, n); err != nil {
					t.Errorf("%s (raw %t), %s: %v", kind, raw, v, err)
				}
			}
		}
	}
}
