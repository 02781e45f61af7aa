package tier

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/miekg/dns"
)

// BenchmarkGet: a lookup that hits, against a real redis-server on
// loopback, with a secret; reports the latency percentiles.
func BenchmarkGet(b *testing.B) {
	r := testenv.StartRedis(b)
	tr := mustTier(b, "shared redis://"+r.Addr+" {\n secret_file "+secretFile(b, testSecret)+"\n}", 1, nil)
	e := built(b, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(b, tr, e)
	keys, name, now := [][]byte{e.Key()}, e.QName(), time.Now().Unix()
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if tr.Get(context.Background(), keys, name, now, take) == nil {
			b.Fatal("miss")
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}
