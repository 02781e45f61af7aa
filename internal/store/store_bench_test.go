package store

import (
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/workload"

	"fmt"
	"sync/atomic"
	"testing"
)

// builtEntries packs the first n entries of the reference workload, each in
// a buffer of its own, so that the benchmarks time the store alone.
func builtEntries(b *testing.B, n int) []entry.Entry {
	b.Helper()
	bld := entry.NewBuilder()
	out := make([]entry.Entry, n)
	for i := range out {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
		if err != nil {
			b.Fatal(err)
		}
		e, err := bld.Build(m, key, "", 0, 3600, 0, 0, 1<<16)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = append(entry.Entry(nil), e...)
	}
	return out
}

// BenchmarkStorePut times the store's share of an insert: hash, index, one
// copy into the arena. It allocates nothing once the arenas have grown.
func BenchmarkStorePut(b *testing.B) {
	entries := builtEntries(b, 1<<16)
	s, err := New(256<<20, PerKind{}, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries { // grow arenas and index first
		s.Put(e, 0)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Put(entries[i%len(entries)], 0)
		i++
	}
}

// BenchmarkStoreGet times a lookup with the full key compared.
func BenchmarkStoreGet(b *testing.B) {
	entries := builtEntries(b, 1<<16)
	s, err := New(256<<20, PerKind{}, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		s.Put(e, 0)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := entries[i%len(entries)].Key()
		h := s.Hash(key)
		sh := s.shard(h)
		sh.mu.Lock()
		if sh.get(key, h) == nil {
			b.Fatal("stored entry not found")
		}
		sh.mu.Unlock()
		i++
	}
}

// BenchmarkStorePutParallel times puts from every core at once into stores
// of 4, 8 and 64 shards (made as for 1, 2 and 16 cores), for the lock
// contention that the number of shards trades against the insert's cost.
// The stores are filled past their budget first, so that the puts reclaim
// chunks rather than fault in new memory, which would time the kernel.
func BenchmarkStorePutParallel(b *testing.B) {
	entries := builtEntries(b, 1<<16)
	for _, procs := range []int{1, 2, 16} {
		s, err := newStoreOn(procs, 128<<20, PerKind{}, 0)
		if err != nil {
			b.Fatal(err)
		}
		for range 16 { // 16 × 65,536 entries of about 180 bytes: past 128 MiB
			for _, e := range entries {
				s.Put(e, 0)
			}
		}
		b.Run(fmt.Sprintf("shards=%d", len(s.shards)), func(b *testing.B) {
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine starts elsewhere in the entries, as
				// clients asking for different names do.
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					s.Put(entries[i%len(entries)], 0)
					i++
				}
			})
		})
	}
}
