//go:build amd64 || arm64

package store

// prefetch asks the CPU to bring the cache line at addr in, and returns at
// once: unlike a load, it neither waits for the line nor faults on an
// address that is not mapped, so it may name memory read without the
// shard's lock, which the shard may have let go of since (Store.Prefetch).
//
//go:noescape
func prefetch(addr uintptr)
