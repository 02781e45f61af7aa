package store

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// testEntry builds the entry for name with an A record carrying val, so a
// lookup can tell which version it found.
func testEntry(t testing.TB, b *entry.Builder, name string, val uint32, ttl uint32, kind int) (entry.Entry, []byte) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	rr := test.A(name + " 300 IN A 192.0.2.1")
	binary.BigEndian.PutUint32(rr.A.To4(), val)
	m.Answer = []dns.RR{rr}
	key, err := entry.KeyFor(name, dns.TypeA, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	var flags uint16
	if kind == KindDenial {
		flags = entry.FlagDenial
	}
	e, err := b.Build(m, key, "", 0, ttl, 0, flags, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	return e, key
}

func (s *Store) lookup(key []byte) (val uint32, ok bool) {
	h := s.Hash(key)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.get(key, h)
	if e == nil {
		return 0, false
	}
	var r entry.Record
	off := e.Records(new([3]int))
	e.Record(off, &r)
	return binary.BigEndian.Uint32(r.Rdata), true
}

func (s *Store) touch(key []byte) {
	h := s.Hash(key)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.get(key, h); e != nil {
		e.Hit(0, 60)
	}
}

// checkShards verifies the invariants every operation must keep: each slot
// locates a live entry whose key hashes to the slot's bits, the counts add
// up, and no shard holds more than its budget.
// putNames stores n names, n0.example.org. on, and checks the shards.
func putNames(t *testing.T, s *Store, n int) {
	t.Helper()
	b := entry.NewBuilder()
	for i := range n {
		e, _ := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), uint32(i), 3600, KindSuccess)
		s.Put(e, 0)
	}
	checkShards(t, s)
}

func checkShards(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestStoreNeverExceedsBudget(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	latest := map[string]uint32{}
	var keys [][]byte
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 100_000 {
		name := fmt.Sprintf("n%d.example.org.", rng.IntN(30_000))
		val := uint32(i)
		e, key := testEntry(t, b, name, val, 3600, KindSuccess)
		s.Put(e, 0)
		if _, seen := latest[name]; !seen {
			keys = append(keys, key)
		}
		latest[name] = val
		if i%5000 == 0 {
			checkShards(t, s)
		}
	}
	checkShards(t, s)
	found := 0
	for _, key := range keys {
		val, ok := s.lookup(key)
		if !ok {
			continue
		}
		found++
		name := dnsName(key)
		if val != latest[name] {
			t.Fatalf("%s: found version %d, latest is %d", name, val, latest[name])
		}
	}
	if n := s.Usage().Kinds[KindSuccess]; found != n {
		t.Fatalf("%d keys found, store counts %d", found, n)
	}
	if found < 1000 || found == len(keys) {
		t.Fatalf("%d of %d keys kept in a 1 MiB store: eviction did not run or kept too little", found, len(keys))
	}
}

func dnsName(key []byte) string {
	name, _, err := dns.UnpackDomainName(key, 0)
	if err != nil {
		panic(err)
	}
	return name
}

func TestStoreDropsExpiredDespiteHits(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	e, key := testEntry(t, b, "old.example.org.", 1, 10, KindSuccess)
	s.Put(e, 0)
	s.touch(key)
	// Fill the ring several times over, long after the entry expired.
	for i := range 50_000 {
		e, _ := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 100)
	}
	if _, ok := s.lookup(key); ok {
		t.Fatal("an expired entry survived the ring because it had been hit")
	}
}

// TestStoreKindLimits: a cap on denials keeps them under it and evicts no
// success for it; on a full store too, whose passes move the chunks the
// caps' cursors point into, checked as it fills.
func TestStoreKindLimits(t *testing.T) {
	const limit = 300
	for _, tc := range []struct {
		capacity int64
		n        int
		fits     bool // the successes all fit the budget
	}{{8 * MinCapacity, 5000, true}, {MinCapacity, 30000, false}} {
		s, err := New(tc.capacity, PerKind{KindDenial: limit}, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := entry.NewBuilder()
		for i := range tc.n {
			e, _ := testEntry(t, b, fmt.Sprintf("d%d.example.org.", i), 1, 3600, KindDenial)
			s.Put(e, 0)
			e, _ = testEntry(t, b, fmt.Sprintf("s%d.example.org.", i), 1, 3600, KindSuccess)
			s.Put(e, 0)
			if i%1000 == 0 {
				checkShards(t, s)
			}
		}
		checkShards(t, s)
		perShard := (limit + len(s.shards) - 1) / len(s.shards)
		if n := s.Usage().Kinds[KindDenial]; n > perShard*len(s.shards) || tc.fits && n < limit/2 {
			t.Fatalf("capacity %d: %d denial entries with a cap of %d", tc.capacity, n, limit)
		}
		if n := s.Usage().Kinds[KindSuccess]; tc.fits && n != tc.n {
			t.Fatalf("%d success entries, want all %d: the denial cap must not evict them", n, tc.n)
		}
	}
}

// TestStoreKindLimitKeepsTheNew: at its kind's cap an entry put is kept, as
// the stock cache keeps what it adds, and an older one goes, even when every
// other entry of the kind has left probation for main (each was put again).
func TestStoreKindLimitKeepsTheNew(t *testing.T) {
	const limit = 64
	s, err := New(8*MinCapacity, PerKind{KindSuccess: limit}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	kept := 0
	const n = 4000
	for i := range n {
		e, key := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), uint32(i), 3600, KindSuccess)
		s.Put(e, 0)
		if _, ok := s.lookup(key); ok {
			kept++
		}
		s.Put(e, 0) // asked again: to main
	}
	checkShards(t, s)
	if kept != n {
		t.Errorf("%d of %d entries found right after they were put", kept, n)
	}
	perShard := (limit + len(s.shards) - 1) / len(s.shards)
	if got := s.Usage().Kinds[KindSuccess]; got > perShard*len(s.shards) {
		t.Errorf("%d entries held, over the cap of %d", got, perShard*len(s.shards))
	}
}

func TestStoreCapacityRange(t *testing.T) {
	for _, c := range []int64{0, MinCapacity - 1, MaxCapacity + 1} {
		if _, err := New(c, PerKind{}, 0); err == nil {
			t.Errorf("capacity %d accepted", c)
		}
	}
}

func TestShardCount(t *testing.T) {
	tests := []struct {
		capacity int64
		procs    int
		want     int
	}{
		{64 << 20, 2, 8},               // four per core
		{64 << 20, 3, 8},               // a power of two, rounded down
		{64 << 20, 64, 16},             // minShardChunks per shard
		{4 << 20, 2, 2},                // two shards of sixteen chunks rather than one
		{6 << 20, 1, 2},                // two, rounded down
		{MinCapacity, 2, 1},            // too small for two rings of sixteen chunks
		{512 << 20, 2, 8},              // the report's budget on two cores
		{512 << 20, 1, 8},              // shards of targetShardBudget
		{1 << 30, 3, 16},               // rounded down to 8, doubled for targetShardBudget
		{16 << 30, 1, maxShards},       // shards over targetShardBudget: no more than maxShards
		{MaxCapacity, 1, maxShards},    // rings of maxChunks
		{MaxCapacity, 1024, maxShards}, // no more than maxShards
	}
	for _, tc := range tests {
		n := shardCount(tc.capacity, tc.procs)
		if n != tc.want {
			t.Errorf("shardCount(%d, %d) = %d, want %d", tc.capacity, tc.procs, n, tc.want)
		}
	}
	capacities := []int64{3 << 20, 96 << 20, 4882 << 20, MaxCapacity - 1}
	for c := int64(MinCapacity); c <= MaxCapacity; c *= 2 {
		capacities = append(capacities, c)
	}
	for _, capacity := range capacities {
		for _, procs := range []int{1, 2, 3, 5, 8, 48, 1000} {
			n := shardCount(capacity, procs)
			switch rings := capacity / int64(n) / chunkSize; {
			case n < 1 || n > maxShards || n&(n-1) != 0:
				t.Errorf("shardCount(%d, %d) = %d: not a power of two in [1, %d]", capacity, procs, n, maxShards)
			case rings > maxChunks:
				t.Errorf("shardCount(%d, %d) = %d: rings of %d chunks, more than %d", capacity, procs, n, rings, maxChunks)
			case n < maxShards && capacity/int64(n) > targetShardBudget:
				t.Errorf("shardCount(%d, %d) = %d: shards of %d bytes, more than %d", capacity, procs, n, capacity/int64(n), targetShardBudget)
			case n > 1 && rings < 16:
				t.Errorf("shardCount(%d, %d) = %d: rings of %d chunks, fewer than 16", capacity, procs, n, rings)
			}
		}
	}
}

// TestSameShapeAcrossCores checks that a reload keeps the store when only
// the number of cores changed, which sets the number of shards and so each
// shard's share of the caps, and not when the configured caps or the stale
// window did.
func TestSameShapeAcrossCores(t *testing.T) {
	newOn := func(procs int, limits PerKind, grace int64) *Store {
		t.Helper()
		s, err := newStoreOn(procs, 64<<20, limits, grace)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	caps := PerKind{KindDenial: 100}
	one, many := newOn(1, caps, 60), newOn(8, caps, 60)
	if len(one.shards) == len(many.shards) || one.shards[0].limits == many.shards[0].limits {
		t.Fatalf("%d shards on 1 core and %d on 8, each capped at %v and %v: the test needs them to differ",
			len(one.shards), len(many.shards), one.shards[0].limits, many.shards[0].limits)
	}
	if !one.SameShape(many) {
		t.Error("a store made on 1 core does not serve in place of one made on 8")
	}
	if one.SameShape(newOn(1, PerKind{KindDenial: 101}, 60)) {
		t.Error("stores with different denial caps have the same shape")
	}
	if one.SameShape(newOn(1, caps, 30)) {
		t.Error("stores with different stale windows have the same shape")
	}
}

// TestTableGrowsWithinBudget checks that a shard whose table, grown, is
// mapped on its own grows it only when its budget holds the old table
// beside the new one, as both are mapped while it is filled; otherwise it
// evicts.
func TestTableGrowsWithinBudget(t *testing.T) {
	if !mapsMemory {
		t.Skip("tables are on the Go heap in this build: the one a resize replaces is the garbage collector's")
	}
	s, err := newStoreOn(1, 64<<20, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	b := entry.NewBuilder()
	i := 0
	// next stores the next entry that falls to shard 0.
	next := func() {
		for ; ; i++ {
			e, key := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), 1, 3600, KindSuccess)
			if s.shard(s.Hash(key)) == sh {
				s.Put(e, 0)
				i++
				return
			}
		}
	}
	// fill stores entries of shard 0 until the next one grows its table.
	fill := func() {
		for 16*(sh.count+1) <= growLoad*sh.table.n {
			next()
		}
	}
	for fill(); tableSizeAfter(len(sh.table.b)) < hugePage; fill() {
		next() // grows a table under a huge page
	}

	size, slots := len(sh.table.b), sh.table.n
	added, both := int64(tableSizeAfter(size)-size), int64(tableSizeAfter(size))
	sh.budget = sh.held + added // room for the new table's added bytes, not beside the old one
	// Past growLoad: the table fills up to fullLoad rather than grow, then
	// entries are evicted.
	for range slots / 8 {
		next()
	}
	if sh.table.n != slots {
		t.Fatalf("the table grew from %d to %d slots with room for %d bytes more, its rebuild needing %d", slots, sh.table.n, sh.budget-sh.held, both)
	}
	if 16*sh.count > fullLoad*slots || 16*sh.count <= growLoad*slots {
		t.Fatalf("%d entries in %d slots: want more than %d sixteenths, no more than %d", sh.count, slots, growLoad, fullLoad)
	}

	fill()
	sh.budget = sh.held + both
	next()
	if len(sh.table.b) != tableSizeAfter(size) {
		t.Fatalf("the table did not grow from %d bytes with room for both tables", size)
	}
	checkShards(t, s)
}

// TestPrefetchViewFollowsShard: what Prefetch reads without the lock is the
// shard's table and ghost as they are, through the table's resizes and the
// ghost's making, while another goroutine prefetches throughout (run with
// -race).
func TestPrefetchViewFollowsShard(t *testing.T) {
	s, err := newStoreOn(1, MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for h := uint64(0); ; h += 0x9e3779b97f4a7c15 {
			select {
			case <-done:
				return
			default:
				s.Prefetch(h)
			}
		}
	})
	b := entry.NewBuilder()
	sizes := map[int]bool{}
	for i := range 40000 {
		e, _ := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
		for k := range s.shards {
			sh := &s.shards[k]
			sh.mu.Lock()
			v := sh.ahead.Load()
			same := unsafe.SliceData(v.table.b) == unsafe.SliceData(sh.table.b) && v.table.n == sh.table.n &&
				unsafe.SliceData(v.ghost) == unsafe.SliceData(sh.ghost) && len(v.ghost) == len(sh.ghost)
			sizes[sh.table.n] = true
			sh.mu.Unlock()
			if !same {
				t.Fatalf("after %d puts, shard %d: Prefetch's view is not the shard's table and ghost", i+1, k)
			}
		}
	}
	close(done)
	wg.Wait()
	if len(sizes) < 3 || s.shards[0].ghost == nil {
		t.Fatalf("the test saw %d table sizes and ghost %t: not the resizes and ghost it is about", len(sizes), s.shards[0].ghost != nil)
	}
}

// TestReplacedNotDisplaced re-puts the oldest entries of a full store, whose
// old versions lie where room is being made: the old version is replaced,
// not displaced, so that the store holds as many entries as were put less
// those it reported displaced, and its key is the newest version's.
func TestReplacedNotDisplaced(t *testing.T) {
	s, err := newStoreOn(1, MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := &storeModel{t: t, s: s, latest: map[string][]byte{}}
	b := entry.NewBuilder()
	for i := range 40000 {
		e, key := modelEntry(t, b, fmt.Sprintf("n%d.example.org.", i), i, 0, 0, 3600)
		m.put(e, key, false)
		if i >= 16000 && i%3 == 0 {
			e, key := modelEntry(t, b, fmt.Sprintf("n%d.example.org.", i-16000), i, 0, 0, 3600)
			m.put(e, key, i%2 == 0)
		}
	}
	checkShards(t, s)
}
