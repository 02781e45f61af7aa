package bench

import (
	"math/rand/v2"

	"github.com/compactcache/compactcache/internal/workload"
)

// BatchLen is the number of queries in a Batch: their names take about
// 120 KB, which stays in a core's cache while they are sent.
const BatchLen = 4096

// Batch is a run of hit queries for entries drawn at random, their qnames
// laid out one after another in the order they are sent. A server unpacks
// each query's name into memory it has just written; a benchmark reading
// names in random order from a table of N instead adds a cache miss or two
// per query, at 1M entries about 500 ns, the same for every cache, that no
// server pays.
type Batch struct {
	keys  [BatchLen]int
	ends  [BatchLen]int
	names string
	buf   []byte
}

// Fill draws the batch's keys from r over [0, n) and builds their names,
// in one allocation.
func (b *Batch) Fill(r *rand.Rand, n int) {
	b.buf = b.buf[:0]
	for j := range b.keys {
		b.keys[j] = r.IntN(n)
		b.buf = workload.AppendName(b.buf, b.keys[j])
		b.ends[j] = len(b.buf)
	}
	b.names = string(b.buf)
}

// query returns query j's entry and qname.
func (b *Batch) query(j int) (int, string) {
	start := 0
	if j > 0 {
		start = b.ends[j-1]
	}
	return b.keys[j], b.names[start:b.ends[j]]
}
