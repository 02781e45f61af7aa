package main

import (
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"time"
	"unsafe"
)

// readNs returns the latency of one dependent read at a random place in a
// buffer of size bytes, in huge pages as the store's arenas and tables are:
// what this machine charges a hit for each of its two memory reads (the
// index slot, then the entry) when the store is that large. Under a
// hypervisor it grows with the bytes beyond what the guest's huge pages
// cover: the host's page walk is not the guest's to shorten.
func readNs(size int64) float64 {
	const page = 2 << 20
	size = max(size, 16<<20) / page * page
	m, err := syscall.Mmap(-1, 0, int(size+page), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return 0
	}
	defer syscall.Munmap(m)
	off := (page - int(uintptr(unsafe.Pointer(&m[0])))%page) % page
	buf := m[off : off+int(size)]
	syscall.Madvise(buf, syscall.MADV_HUGEPAGE)
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&buf[0])), size/8)
	// A random word in each 64-byte line, written in every page so that
	// every page is faulted in before the timing.
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(words); i += 8 {
		words[i] = r.Uint64()
	}
	lines := uint64(len(words) / 8)
	// Each read's place comes from the word the last read returned, so the
	// reads wait for each other as a hit's do; the step count mixed in keeps
	// the walk from closing into a cycle that fits in the caches.
	const reads = 2_000_000
	var times []float64
	for range 3 {
		var i uint64
		begin := time.Now()
		for k := range uint64(reads) {
			i, _ = bits.Mul64(words[i*8]^k*0x9e3779b97f4a7c15, lines)
		}
		times = append(times, float64(time.Since(begin).Nanoseconds())/reads)
		runtime.KeepAlive(i) // the walk's result, so that the compiler keeps the walk
	}
	slices.Sort(times)
	return times[1]
}

// pageWrites measures what fresh memory costs this machine, in µs per 4 KiB
// page of 64 MiB mapped in small pages, as a store's chunks are while it
// grows: a write to a page never touched (a page fault); MADV_POPULATE_WRITE,
// which the store makes on each chunk it hands out; the first write to a
// page after it; a later write. Under a hypervisor that shadows the guest's
// page tables the first write after populating still costs the hypervisor's
// work for the page, which the guest's profiler does not see: a fill's
// inserts pay it, a full cache's, writing pages written before, do not.
func pageWrites() pageCosts {
	const size, page = 64 << 20, 4 << 10
	touch := func(m []byte, at int) time.Duration {
		begin := time.Now()
		for i := at; i < len(m); i += page {
			m[i] = 1
		}
		return time.Since(begin)
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / (size / page) / 1000 }
	var c pageCosts
	fresh, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return c
	}
	syscall.Madvise(fresh, syscall.MADV_NOHUGEPAGE)
	c.fault = us(touch(fresh, 0))
	syscall.Munmap(fresh)
	m, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return c
	}
	defer syscall.Munmap(m)
	syscall.Madvise(m, syscall.MADV_NOHUGEPAGE)
	begin := time.Now()
	if syscall.Madvise(m, madvisePopulateWrite) != nil {
		return c
	}
	c.populate = us(time.Since(begin))
	c.firstWrite = us(touch(m, 64))
	c.again = us(touch(m, 128))
	return c
}

// madvisePopulateWrite is MADV_POPULATE_WRITE (Linux 5.14), as the store
// uses it.
const madvisePopulateWrite = 23
