//go:build !compactcache_poison

package store

// poison is off: callbacks get the entries themselves.
const poison = false

const poisonByte = 0
