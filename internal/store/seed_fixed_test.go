//go:build compactcache_seed

package store

import (
	"fmt"
	"testing"
)

// TestSeededHash checks that a seed gives the same hashes every time, that
// another seed gives others, and that the bits the shards, the index and
// the ghost read from a hash are spread: each bit set for about half of a
// thousand keys.
func TestSeededHash(t *testing.T) {
	const n = 1000
	var ones [64]int
	for i := range n {
		key := []byte(fmt.Sprintf("n%d.example.org.", i))
		a, b := seededHash(7, key), seededHash(7, key)
		if a != b {
			t.Fatalf("%s: seed 7 hashed to %#x, then %#x", key, a, b)
		}
		if c := seededHash(8, key); c == a {
			t.Errorf("%s: seeds 7 and 8 both hashed to %#x", key, a)
		}
		for k := range 64 {
			ones[k] += int(a >> k & 1)
		}
	}
	for k, c := range ones {
		if c < n*4/10 || c > n*6/10 {
			t.Errorf("bit %d set in %d of %d hashes", k, c, n)
		}
	}
}
