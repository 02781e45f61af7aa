//go:build compactcache_poison

package store

// poison makes the store lend callbacks copies of entries and overwrite
// them with poisonByte once the callback returns, so that a caller that
// keeps an entry past its shard's lock reads garbage in tests, where it
// would read another entry's bytes only once its shard had moved it.
const poison = true

const poisonByte = 0xDB
