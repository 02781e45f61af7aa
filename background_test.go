package compactcache

import (
	"testing"
	"time"
)

// TestPrefetchInheritsPopularity: an entry refreshed by prefetch keeps the
// popularity of the entry it replaces (README, prefetch), so that a name
// asked often enough is prefetched again near its next expiry by one more
// hit, an ECS variant as much as the answer for everyone.
func TestPrefetchInheritsPopularity(t *testing.T) {
	for _, subnet := range []string{"", "10.1.2.0/24"} {
		t.Run(subnet, func(t *testing.T) {
			g := newGeoUpstream()
			clk := newClock()
			c := newGeoCache(t, "compactcache {\n prefetch 2 10m 10%\n}", g, clk)
			req := geoQuery("s16.geo.", subnet)
			ask(t, c, req, false) // the miss: stored at 0, TTL 300
			clk.advance(100 * time.Second)
			ask(t, c, req, false) // popularity 1
			clk.advance(175 * time.Second)
			ask(t, c, req, false) // popularity 2, 25 s left: prefetched
			await(t, "the prefetch", func() bool { return g.count("s16.geo.") == 2 && !c.refreshes.running() })
			clk.advance(275 * time.Second) // 25 s left of the prefetched entry
			ask(t, c, req, false)          // popularity 3 with the inherited 2: prefetched again
			await(t, "the second prefetch", func() bool { return g.count("s16.geo.") == 3 })
		})
	}
}
