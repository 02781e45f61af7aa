//go:build !compactcache_seed

package store

import "hash/maphash"

// keyHash is the hash of a key under a store's random seed, so that clients
// cannot pick names that fall in one bucket.
func keyHash(seed maphash.Seed, key []byte) uint64 { return maphash.Bytes(seed, key) }
