//go:build compactcache_seed

package store

import (
	"hash/maphash"
	"os"
	"strconv"
)

// fixedSeed, from COMPACTCACHE_SEED in builds for benchmarks, makes every
// store of the process hash keys alike in every run: maphash's hashes differ
// between processes whatever the seed, and two eviction policies compare
// only on the same draws. 0, or unset, keeps maphash.
var fixedSeed, _ = strconv.ParseUint(os.Getenv("COMPACTCACHE_SEED"), 0, 64)

func keyHash(seed maphash.Seed, key []byte) uint64 {
	if fixedSeed == 0 {
		return maphash.Bytes(seed, key)
	}
	return seededHash(fixedSeed, key)
}

// seededHash is FNV-1a over key from seed, finished with splitmix64's mix
// so that every bit of the result depends on every byte.
func seededHash(seed uint64, key []byte) uint64 {
	h := seed ^ 0xcbf29ce484222325
	for _, b := range key {
		h = (h ^ uint64(b)) * 0x100000001b3
	}
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return h ^ h>>31
}
