package main

import (
	"math/bits"
	"math/rand/v2"
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
		sink = i
	}
	slices.Sort(times)
	return times[1]
}

// sink keeps the walk's result, so that the compiler keeps the walk.
var sink uint64
