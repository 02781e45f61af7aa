package store

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/miekg/dns"
)

// queueOf returns the queue holding the entry under key, noQueue when there
// is none.
func (s *Store) queueOf(key []byte) int {
	h := s.Hash(key)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(key, h)
	if i < 0 {
		return noQueue
	}
	return int(sh.in[sh.table.loc(sh.table.load(i))>>chunkBits])
}

// bigEntry builds an entry for name with a TXT record of size bytes.
func bigEntry(t testing.TB, b *entry.Builder, name string, size int) (entry.Entry, []byte) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeTXT)
	txt := &dns.TXT{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 3600}}
	for ; size > 0; size -= 256 {
		txt.Txt = append(txt.Txt, strings.Repeat("x", min(size, 256)-1))
	}
	m.Answer = []dns.RR{txt}
	key, err := entry.KeyFor(name, dns.TypeTXT, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := b.Build(m, key, "", 0, 3600, 0, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	return e, key
}

// TestProbationRefusesOneOffs floods a store with names asked once, among
// which a hot set is asked throughout: the hot names stay, the one-off
// ones are dropped from probation and counted as refused, not evicted.
func TestProbationRefusesOneOffs(t *testing.T) {
	s, err := New(4*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	var hot [][]byte
	for i := range 1000 {
		e, key := testEntry(t, b, fmt.Sprintf("hot%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
		hot = append(hot, key)
	}
	var d Displaced
	add := func(x Displaced) {
		for k := range d.Evicted {
			d.Evicted[k] += x.Evicted[k]
			d.Refused[k] += x.Refused[k]
		}
	}
	hits, asks := 0, 0
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300_000 {
		e, _ := testEntry(t, b, fmt.Sprintf("cold%d.example.org.", i), 1, 3600, KindSuccess)
		add(s.Put(e, 0))
		if i%5 == 0 {
			key := hot[rng.IntN(len(hot))]
			asks++
			if _, ok := s.lookup(key); ok {
				hits++
				s.touch(key)
			} else {
				e, _ := testEntry(t, b, dnsName(key), 1, 3600, KindSuccess)
				add(s.Put(e, 0))
			}
		}
	}
	checkShards(t, s)
	// The first asks of the hot names come before any eviction: every
	// miss is one the policy caused.
	if rate := float64(hits) / float64(asks); rate < 0.999 {
		t.Errorf("hot set hit rate %.4f in a flood of names asked once, want at least 0.999", rate)
	}
	kept := s.Usage().Kinds[KindSuccess]
	if gone := d.Evicted[KindSuccess] + d.Refused[KindSuccess]; gone != 301_000-kept+(asks-hits) {
		t.Errorf("%d entries dropped, %d stored and %d kept", gone, 301_000+asks-hits, kept)
	}
	if d.Refused[KindSuccess] < 200_000 {
		t.Errorf("%d of %d entries dropped refused admission: the names asked once should be", d.Refused[KindSuccess], d.Refused[KindSuccess]+d.Evicted[KindSuccess])
	}
}

// TestQueuesTurn fills stores far past their budget with names asked
// once, among which a hot set is asked throughout and a warm set, larger
// than main holds, now and then, and checks as it goes that each queue's
// chunks hold entries in all but the room its turning chunk makes at a
// time (turnRoom, and less than an entry at the end of each chunk), rather
// than the room each pass of a whole chunk frees; and that what the store
// holds stays consistent while entries pass from the middle of a chunk,
// under a cap on a kind too, whose evictions search the chunks.
func TestQueuesTurn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		procs    int
		capacity int64
		limits   PerKind
	}{
		{"one shard", 1, MinCapacity, PerKind{}},
		{"two shards", 1, 4 * MinCapacity, PerKind{}},
		// Two shards of 48 chunks, whose tables grow ahead of the
		// chunks: the queues' room is what this test is about.
		{"probation keeps two chunks", 1, 12 * MinCapacity, PerKind{}},
		{"denial cap", 1, 4 * MinCapacity, PerKind{KindDenial: 2000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newStoreOn(tc.procs, tc.capacity, tc.limits, 0)
			if err != nil {
				t.Fatal(err)
			}
			b := entry.NewBuilder()
			var hot [][]byte
			for i := range 2000 {
				e, key := testEntry(t, b, fmt.Sprintf("hot%d.example.org.", i), 1, 3600, KindSuccess)
				s.Put(e, 0)
				hot = append(hot, key)
			}
			ask := func(name string) {
				_, key := testEntry(t, b, name, 1, 3600, KindSuccess)
				if _, ok := s.lookup(key); ok {
					s.touch(key)
					return
				}
				e, _ := testEntry(t, b, name, 1, 3600, KindSuccess)
				s.Put(e, 0)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			n := int(tc.capacity / 32) // about three budgets of names asked once
			var turned [numQueues]bool
			for i := range n {
				kind := KindSuccess
				if i%3 == 0 {
					kind = KindDenial
				}
				e, _ := testEntry(t, b, fmt.Sprintf("cold%d.example.org.", i), 1, 3600, kind)
				s.Put(e, 0)
				if i%2 == 0 {
					ask(dnsName(hot[rng.IntN(len(hot))]))
				} else {
					ask(fmt.Sprintf("warm%d.example.org.", rng.IntN(n/4)))
				}
				if i < n/2 || i%101 != 0 {
					continue // the stores fill over about the first budget
				}
				for k := range s.shards {
					sh := &s.shards[k]
					for q := range numQueues {
						qu := &sh.queues[q]
						empty := 0
						for at := range qu.n {
							c := qu.at(at)
							empty += len(sh.chunks[c]) - sh.filled(c)
						}
						if most := turnRoom + 256*qu.n; empty > most {
							t.Fatalf("after %d names, shard %d: queue %d's %d chunks hold no entry in %d bytes, want at most %d (turning chunk %d, front %d, back %d)", i, k, q, qu.n, empty, most, sh.turning[q], sh.newEnd[q], sh.oldStart[q])
						}
						turned[q] = turned[q] || sh.turning[q] >= 0
					}
				}
				if i%2020 == 0 {
					checkShards(t, s)
				}
			}
			checkShards(t, s)
			if turned != [numQueues]bool{true, true} {
				t.Errorf("probation turned %t, main %t", turned[probationQ], turned[mainQ])
			}
			if l := tc.limits[KindDenial]; l > 0 && s.Usage().Kinds[KindDenial] > l+len(s.shards) {
				t.Errorf("%d denial entries, cap %d", s.Usage().Kinds[KindDenial], l)
			}
		})
	}
}

// TestEvictOldestTurning: the cap on a kind evicts its oldest entry. While
// probation turns a chunk, that entry is in the chunk's older span, which
// sits at the queue's end behind the chunks written after it, not in the
// chunk at the queue's head.
func TestEvictOldestTurning(t *testing.T) {
	s, err := newStoreOn(1, MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	b := entry.NewBuilder()
	var keys [][]byte
	room := func() int { return sh.oldStart[probationQ] - sh.newEnd[probationQ] }
	for len(keys) < 1_000_000 {
		e, key := testEntry(t, b, fmt.Sprintf("d%d.example.org.", len(keys)), 1, 3600, KindDenial)
		s.Put(e, 0)
		keys = append(keys, key)
		// Stop where probation turns a chunk with older entries left in it,
		// behind another chunk of probation, and with room for the next
		// entry, so that the put below turns nothing and only the cap
		// evicts.
		if c := sh.turning[probationQ]; c >= 0 && sh.queues[probationQ].n > 1 &&
			sh.oldStart[probationQ] < int(sh.used[c]) && room() >= 2*len(e) {
			break
		}
	}
	if sh.turning[probationQ] < 0 {
		t.Fatal("probation never turned a chunk")
	}
	oldest := -1
	live := make([]bool, len(keys))
	for i, key := range keys {
		if _, live[i] = s.lookup(key); live[i] && oldest < 0 {
			oldest = i
		}
	}
	sh.limits[KindDenial] = sh.kinds[KindDenial]
	e, key := testEntry(t, b, "last.example.org.", 1, 3600, KindDenial)
	s.Put(e, 0)
	if _, ok := s.lookup(key); !ok {
		t.Fatal("the new entry is not stored")
	}
	var gone []int
	for i, key := range keys {
		if _, ok := s.lookup(key); live[i] && !ok {
			gone = append(gone, i)
		}
	}
	if len(gone) != 1 || gone[0] != oldest {
		t.Fatalf("the cap evicted entries %v, want the oldest, %d", gone, oldest)
	}
	checkShards(t, s)
}

// TestEvictOldestResumes: with both queues turning as in service (a hot
// set asked throughout, names asked once among which the denials) and main
// turning a chunk it took from probation before probation began turning
// one, the cap's evictions, one after another, drop probation's denials by
// when they were stored: the older spans of the turning chunks first, main's
// before probation's, then probation's chunks. Every eviction but the first
// resumes where the one before stopped.
func TestEvictOldestResumes(t *testing.T) {
	s, err := newStoreOn(1, 4*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0] // the one watched; its keys are checked
	b := entry.NewBuilder()
	var hot, denials [][]byte
	for i := range 2000 {
		e, key := testEntry(t, b, fmt.Sprintf("hot%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
		hot = append(hot, key)
	}
	// The queue whose entry the slot of key locates: a turning chunk's
	// older span holds entries of the queue it turns for.
	queueOf := func(key []byte) int {
		h := s.Hash(key)
		loc := sh.table.loc(sh.table.load(sh.find(key, h)))
		c, off := int(loc>>chunkBits), int(loc&(chunkSize-1))
		if x := sh.turningIn(c); x >= 0 && off >= sh.oldStart[x] {
			return sh.from[x]
		}
		return int(sh.in[c])
	}
	// liveDenial reports whether the older span of queue q's turning chunk
	// holds a live denial.
	liveDenial := func(q int) bool {
		x := sh.turning[q]
		for off := sh.oldStart[q]; off < int(sh.used[x]); {
			e := entry.Entry(sh.chunks[x][off:])
			if KindOf(e) == KindDenial && sh.slotOf(location(x, off), keyHash(sh.seed, e.Key())) >= 0 {
				return true
			}
			off += e.Size()
		}
		return false
	}
	// Until main turns a chunk of probation's, having begun before
	// probation's turn of one, with live denials in both older spans: the
	// older of them then sits behind the other in queue order.
	ready := func() bool {
		return sh.turning[mainQ] >= 0 && sh.from[mainQ] == probationQ && sh.turning[probationQ] >= 0 &&
			sh.turnBegan[mainQ] < sh.turnBegan[probationQ] && liveDenial(mainQ) && liveDenial(probationQ)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; !ready(); i++ {
		if i == 2_000_000 {
			t.Fatal("main never turned a chunk of probation's before probation turned one")
		}
		kind := KindSuccess
		if i%3 == 0 {
			kind = KindDenial
		}
		e, key := testEntry(t, b, fmt.Sprintf("cold%d.example.org.", i), 1, 3600, kind)
		s.Put(e, 0)
		if kind == KindDenial {
			denials = append(denials, key)
		}
		hk := hot[rng.IntN(len(hot))]
		if _, ok := s.lookup(hk); ok {
			s.touch(hk)
		}
	}
	var inProbation [][]byte
	for _, key := range denials {
		if _, ok := s.lookup(key); ok && s.shard(s.Hash(key)) == sh && queueOf(key) == probationQ {
			inProbation = append(inProbation, key)
		}
	}
	if len(inProbation) < 2 {
		t.Fatalf("%d denials in probation", len(inProbation))
	}
	for n, key := range inProbation {
		var d Displaced
		sh.mu.Lock()
		sh.evictOldest(KindDenial, ^uint64(0), &d) // none kept
		sh.mu.Unlock()
		if _, ok := s.lookup(key); ok || d.Evicted[KindDenial] != 1 {
			t.Fatalf("eviction %d of %d: %d evicted, the oldest (%s) kept: %t", n, len(inProbation), d.Evicted[KindDenial], dnsName(key), ok)
		}
	}
	checkShards(t, s)
}

// TestShedTurns fills a store whose entries are small for the table the
// budget lets it have: the table, not the chunks, is what limits the
// entries, and the store drops entries to insert more. Probation turns a
// few KiB further each time, so that the table stays about as full as it
// may be, rather than passing a whole chunk, whose thousands of entries
// would leave the table that much emptier until the inserts refill it.
func TestShedTurns(t *testing.T) {
	// Entries of about 50 bytes fill a table of 128 KiB (21,845 slots of
	// 6 bytes) in about 1 MiB; growing it takes 64 KiB more (192 KiB where
	// the old table stays mapped while the new one fills), which 1.1875 MiB
	// does not hold.
	s, err := newStoreOn(1, 19*MinCapacity/16, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	b := entry.NewBuilder()
	rng := rand.New(rand.NewPCG(7, 8))
	bound := false
	for i := range 200_000 {
		e, _ := testEntry(t, b, fmt.Sprintf("c%d.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
		_, key := testEntry(t, b, fmt.Sprintf("h%d.org.", rng.IntN(2000)), 1, 3600, KindSuccess)
		if _, ok := s.lookup(key); ok {
			s.touch(key)
		} else {
			e, _ := testEntry(t, b, dnsName(key), 1, 3600, KindSuccess)
			s.Put(e, 0)
		}
		full := fullLoad * sh.table.n / 16
		if !bound || i < 100_000 {
			// The first drops come before main holds a chunk.
			bound = bound || sh.count+1 >= full && sh.held+sh.growthRoom() > sh.budget
			continue
		}
		if sh.count < full-600 {
			t.Fatalf("after %d names, the table holds %d entries, %d under its most (probation %d chunks, main %d)", i, sh.count, full-sh.count, sh.queues[probationQ].n, sh.queues[mainQ].n)
		}
	}
	if !bound {
		t.Fatalf("the table never filled: %d entries in %d slots", sh.count, sh.table.n)
	}
	checkShards(t, s)
}

// TestWalkVisitsUnmovedOnce walks a full shard a chunk at a time with puts
// between the chunks, so that both queues turn chunks the walk has already
// visited and meets them again as their queue's newest: no entry that was
// never asked again, and so never kept by a pass (which moves it to main's
// end, if only to its own place), is visited twice.
func TestWalkVisitsUnmovedOnce(t *testing.T) {
	s, sh, b := smallestStore(t)
	next := 0
	asked := map[string]bool{}
	put := func() {
		e, key := testEntry(t, b, fmt.Sprintf("c%d.org.", next), 1, 3600, KindSuccess)
		s.Put(e, 0)
		if next%3 == 0 {
			s.touch(key) // asked again: kept, so main fills and turns too
			asked[string(key)] = true
		}
		next++
	}
	for range 60_000 {
		put()
	}
	at := map[string]uint64{}
	twice, turned := 0, 0
	visit := func(e entry.Entry) bool {
		h := s.Hash(e.Key())
		loc := sh.table.loc(sh.table.load(sh.find(e.Key(), h)))
		if prev, ok := at[string(e.Key())]; ok && prev == loc && !asked[string(e.Key())] {
			twice++
		}
		at[string(e.Key())] = loc
		return false
	}
	for c, more := s.Walk(Cursor{}, visit); more; c, more = s.Walk(c, visit) {
		for range 500 {
			put()
		}
		if sh.turning[probationQ] >= 0 || sh.turning[mainQ] >= 0 {
			turned++
		}
		checkShards(t, s)
	}
	if turned == 0 {
		t.Fatal("no chunk turned during the walk: the test needs them to")
	}
	if twice > 0 {
		t.Fatalf("%d entries visited twice at the same place", twice)
	}
}

// TestWalkWhileTurning walks a full store in which both queues turn their
// chunks while names are stored and asked between the walk's chunks: every
// entry stored when the walk began and still there at its end is visited.
func TestWalkWhileTurning(t *testing.T) {
	s, _, b := smallestStore(t)
	rng := rand.New(rand.NewPCG(5, 6))
	next := 0
	stored := map[string]bool{} // names stored again during the walk
	step := func() {
		e, _ := testEntry(t, b, fmt.Sprintf("cold%d.example.org.", next), 1, 3600, KindSuccess)
		s.Put(e, 0)
		next++
		name := fmt.Sprintf("warm%d.example.org.", rng.IntN(10_000))
		if next%2 == 0 {
			name = fmt.Sprintf("hot%d.example.org.", rng.IntN(1000))
		}
		_, key := testEntry(t, b, name, 1, 3600, KindSuccess)
		if _, ok := s.lookup(key); ok {
			s.touch(key)
		} else {
			e, _ := testEntry(t, b, name, 1, 3600, KindSuccess)
			s.Put(e, 0)
			stored[string(key)] = true
		}
	}
	for range 60_000 {
		step()
	}
	atStart := map[string]bool{}
	for c, more := (Cursor{}), true; more; {
		c, more = s.Walk(c, func(e entry.Entry) bool {
			atStart[string(e.Key())] = true
			return false
		})
	}
	clear(stored)
	visited := map[string]bool{}
	var turned [numQueues]bool
	for c, more := (Cursor{}), true; more; {
		c, more = s.Walk(c, func(e entry.Entry) bool {
			visited[string(e.Key())] = true
			return false
		})
		for range 100 {
			step()
			for k := range s.shards {
				for q := range numQueues {
					turned[q] = turned[q] || s.shards[k].turning[q] >= 0
				}
			}
		}
	}
	if turned != [numQueues]bool{true, true} {
		t.Fatalf("during the walk, probation turned %t, main %t", turned[probationQ], turned[mainQ])
	}
	missed := 0
	for key := range atStart {
		if _, ok := s.lookup([]byte(key)); ok && !visited[key] && !stored[key] {
			missed++
		}
	}
	if missed > 0 {
		t.Fatalf("%d entries stored before the walk and there after it were not visited", missed)
	}
	checkShards(t, s)
}

// passProbation passes every chunk of probation in every shard, as a flood
// of new names would.
func (s *Store) passProbation() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		var d Displaced
		for range sh.queues[probationQ].n {
			c := sh.dequeue(probationQ)
			sh.pass(c, probationQ, false, 0, &d)
			sh.enqueue(probationQ, c)
		}
		sh.mu.Unlock()
	}
}

// TestGhostReadmits checks where entries go: new ones to probation, those
// that replace an entry to main, and those whose key probation dropped to
// main when they are asked again; a large entry asked again goes through
// probation a second time unless the coin let the ghost trust it, and to
// main the third.
func TestGhostReadmits(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	small, key := testEntry(t, b, "small.example.org.", 1, 3600, KindSuccess)
	s.Put(small, 0)
	if q := s.queueOf(key); q != probationQ {
		t.Fatalf("a new entry went to queue %d, want probation", q)
	}
	s.Put(small, 0)
	if q := s.queueOf(key); q != mainQ {
		t.Fatalf("an entry replacing one went to queue %d, want main", q)
	}

	hit, hkey := testEntry(t, b, "hit.example.org.", 1, 3600, KindSuccess)
	s.Put(hit, 0)
	s.touch(hkey)
	other, okey := testEntry(t, b, "other.example.org.", 1, 3600, KindSuccess)
	s.Put(other, 0)
	s.passProbation()
	if q := s.queueOf(hkey); q != mainQ {
		t.Fatalf("an entry hit in probation is in queue %d after probation passed, want main", q)
	}
	if q := s.queueOf(okey); q != noQueue {
		t.Fatalf("an entry never hit is in queue %d after probation passed", q)
	}
	s.Put(other, 0)
	if q := s.queueOf(okey); q != mainQ {
		t.Fatalf("an entry probation dropped, asked again, went to queue %d, want main", q)
	}

	trusted, tentative := 0, 0
	for n := range 40 {
		large, lkey := bigEntry(t, b, fmt.Sprintf("large%d.example.org.", n), 1000)
		s.Put(large, 0)
		s.passProbation()
		s.Put(large, 0)
		switch s.queueOf(lkey) {
		case mainQ:
			trusted++
			continue
		case probationQ:
			tentative++
		default:
			t.Fatal("a large entry just stored is not in the store")
		}
		s.passProbation()
		s.Put(large, 0)
		if q := s.queueOf(lkey); q != mainQ {
			t.Fatalf("a large entry asked a third time went to queue %d, want main", q)
		}
	}
	// The ghost trusts an entry of about 1,000 bytes at its first drop
	// with a chance of trustedSize/1000.
	if trusted == 0 || tentative < 25 {
		t.Errorf("of 40 large entries asked again, %d went to main and %d to probation", trusted, tentative)
	}
	checkShards(t, s)
}

// TestStaleGetsOneTurn: an entry expired within the serve-stale window,
// however often it was hit, is kept by a pass of main with no hit left, and
// dropped by the next unless it was hit in between.
func TestStaleGetsOneTurn(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 3600)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	e, key := testEntry(t, b, "stale.example.org.", 1, 10, KindSuccess)
	s.Put(e, 0)
	s.Put(e, 0) // to main
	for range 3 {
		s.touch(key)
	}
	h := s.Hash(key)
	sh := s.shard(h)
	pass := func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		var d Displaced
		c := sh.dequeue(mainQ)
		sh.pass(c, mainQ, true, 100, &d)
		sh.enqueue(mainQ, c)
	}
	pass()
	if _, ok := s.lookup(key); !ok {
		t.Fatal("a stale entry hit three times was dropped at its first pass")
	}
	pass()
	if _, ok := s.lookup(key); ok {
		t.Fatal("a stale entry not hit since the last pass survived another")
	}
	checkShards(t, s)
}

// TestGiveUpChunkForTable fills a store with large entries first, so that
// its chunks take the budget while its index table is small, then with small
// ones: the table grows, a chunk given up for it, instead of capping the
// entries the chunks have room for; the memory mapped stays within the
// budget.
func TestGiveUpChunkForTable(t *testing.T) {
	before := OffHeapBytes()
	s, err := newStoreOn(1, 4*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	for i := range 3000 {
		e, _ := bigEntry(t, b, fmt.Sprintf("large%d.example.org.", i), 3000)
		s.Put(e, 0)
	}
	sh := &s.shards[0]
	slots := sh.table.n
	if sh.budget-sh.held >= chunkSize {
		t.Fatalf("large entries left %d bytes of the budget: the test needs the chunks to take it", sh.budget-sh.held)
	}
	for i := range 60_000 {
		e, _ := testEntry(t, b, fmt.Sprintf("small%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
	}
	checkShards(t, s)
	if sh.table.n <= slots || sh.count <= slots*7/8 {
		t.Fatalf("the table went from %d to %d slots, %d entries: it did not grow for the small entries", slots, sh.table.n, sh.count)
	}
	released := 0
	for c := range sh.allocated {
		if sh.chunks[c] == nil {
			released++
		}
	}
	if released == 0 {
		t.Fatal("no chunk was given up for the table")
	}
	if mapped := OffHeapBytes() - before; mapped > s.capacity {
		t.Fatalf("%d bytes mapped for a store of %d", mapped, s.capacity)
	}
}

// TestShortLastChunk: the last chunk a shard's budget holds may be short,
// never shorter than any entry needs, and only where the index table could
// not grow in what is left of the budget anyway.
func TestShortLastChunk(t *testing.T) {
	s, err := newStoreOn(1, MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	sh.held = sh.budget - (minShortChunk + 5000)
	if got := sh.nextChunkSize(); got != 0 {
		t.Errorf("a short chunk of %d bytes where the table could grow", got)
	}
	sh.resize(256 << 10) // a table that could not grow in less than a chunk
	for _, tc := range []struct {
		room int64
		want int
	}{
		{chunkSize + 1, chunkSize},
		{minShortChunk + 5000, (minShortChunk + 5000) &^ 4095},
		{minShortChunk - 1, 0},
	} {
		sh.held = sh.budget - tc.room
		if got := sh.nextChunkSize(); got != tc.want {
			t.Errorf("with %d bytes of the budget left, a chunk of %d bytes, want %d", tc.room, got, tc.want)
		}
	}

	// Filled, stores of budgets a chunk apart: some take a short chunk,
	// and all hold what they account.
	b := entry.NewBuilder()
	shorts := 0
	for capacity := int64(2 << 20); capacity < 3<<20; capacity += 64 << 10 {
		s, err := newStoreOn(1, capacity, PerKind{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50_000 {
			e, _ := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), 1, 3600, KindSuccess)
			s.Put(e, 0)
		}
		checkShards(t, s)
		for _, c := range s.shards[0].chunks {
			if c != nil && len(c) < chunkSize {
				shorts++
			}
		}
	}
	if shorts == 0 {
		t.Error("no store took a short chunk")
	}
}

// TestWalkWhilePromoting walks a full store while entries are stored and
// hit between its chunks, so that the policy moves entries from probation
// to main as it goes: every entry stored when the walk began and still
// there at its end is visited.
func TestWalkWhilePromoting(t *testing.T) {
	s, err := New(2*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	var keys [][]byte
	for i := range 30_000 {
		e, key := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
		keys = append(keys, key)
	}
	atStart := map[string]bool{}
	for _, key := range keys {
		if _, ok := s.lookup(key); ok {
			atStart[string(key)] = true
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	visited := map[string]bool{}
	var c Cursor
	next := 30_000
	for more := true; more; {
		c, more = s.Walk(c, func(e entry.Entry) bool {
			visited[string(e.Key())] = true
			return false
		})
		for range 200 {
			key := keys[rng.IntN(len(keys))]
			s.touch(key)
			e, k := testEntry(t, b, fmt.Sprintf("n%d.example.org.", next), 1, 3600, KindSuccess)
			s.Put(e, 0)
			keys = append(keys, k)
			next++
		}
	}
	missed := 0
	for key := range atStart {
		if _, ok := s.lookup([]byte(key)); ok && !visited[key] {
			missed++
		}
	}
	if missed > 0 {
		t.Fatalf("%d entries stored before the walk and there after it were not visited", missed)
	}
	checkShards(t, s)
}

// TestReadmitWithinRound: a key the ghost remembers in full goes to main
// when asked again within a readmitShare-th of main's round, through
// probation again when asked later, and to main whatever its age before
// main has a round measured.
// otherMark returns a hash of h's ghost bucket whose mark is the j-th after
// h's: another fingerprint, never h's and never 0, which ghostMark would
// turn into one that two hashes share.
func otherMark(h uint64, j int) uint64 {
	m := ghostMark(h) + uint64(j+1)*2 // marks are even: bit 0 is ghostKnown
	if m > ghostLane {
		m -= ghostLane - 1
	}
	return h&^(ghostLane<<16) | m<<16
}

func TestReadmitWithinRound(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.shards) != 1 {
		t.Fatalf("%d shards, want 1", len(s.shards))
	}
	sh := &s.shards[0]
	b := entry.NewBuilder()
	late, lkey := testEntry(t, b, "late.example.org.", 1, 3600, KindSuccess)
	late = append(entry.Entry(nil), late...) // the builder's buffer is reused
	early, ekey := testEntry(t, b, "early.example.org.", 1, 3600, KindSuccess)
	// Dropped from probation, then three keys of its bucket after it: its
	// mark is in lane 3, three pushes into its bucket old.
	age := func(e entry.Entry, key []byte) {
		t.Helper()
		s.Put(e, 0)
		s.passProbation()
		h := s.Hash(key)
		for j := range 3 {
			sh.remember(otherMark(h, j), trustedSize)
		}
	}
	age(late, lkey)
	// Main's round: a readmitShare-th of it is about 2.2 pushes into a
	// bucket, under the mark's age.
	buckets := uint64(len(sh.ghost) / ghostBucketWords)
	sh.mainGap = (2*buckets*readmitShare + buckets) << 8 / uint64(sh.queues[mainQ].n+1)
	if round := sh.mainRound(); round < 2*buckets*readmitShare || round >= 3*buckets*readmitShare {
		t.Fatalf("main's round is %d ticks, want [%d, %d)", round, 2*buckets*readmitShare, 3*buckets*readmitShare)
	}
	s.Put(late, 0)
	if q := s.queueOf(lkey); q != probationQ {
		t.Fatalf("a key asked again after a %d-th of main's round went to queue %d, want probation", readmitShare, q)
	}
	// Dropped again, asked again at once: to main.
	s.passProbation()
	s.Put(late, 0)
	if q := s.queueOf(lkey); q != mainQ {
		t.Fatalf("a key asked again at once went to queue %d, want main", q)
	}

	// Before main's first pass, any age.
	age(early, ekey)
	sh.mainGap = 0
	s.Put(early, 0)
	if q := s.queueOf(ekey); q != mainQ {
		t.Fatalf("with main's round unknown, a key asked again went to queue %d, want main", q)
	}
	checkShards(t, s)
}

// TestMainRound: main's round is its chunks, and the one passed, times the
// mean ticks of the ghost's clock between two passes of main, which the
// passes of its oldest chunk measure.
func TestMainRound(t *testing.T) {
	sh := ghostShard(t)
	m := &sh.queues[mainQ]
	for range 200 {
		sh.ghostClock += 100
		sh.passedMain()
	}
	want := 100 * uint64(m.n+1)
	if round := sh.mainRound(); round < want*98/100 || round > want {
		t.Errorf("main's round %d ticks after passes 100 ticks apart, want about %d", round, want)
	}
	for range 200 {
		sh.ghostClock += 10
		sh.passedMain()
	}
	want = 10 * uint64(m.n+1)
	if round := sh.mainRound(); round < want || round > want*102/100 {
		t.Errorf("main's round %d ticks after passes 10 ticks apart, want about %d", round, want)
	}

	// A store whose main passes chunks times them.
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	for i := range 30_000 {
		e, key := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i%15_000), 1, 3600, KindSuccess)
		s.Put(e, 0)
		if i%3 == 0 {
			s.touch(key)
		}
	}
	sh = &s.shards[0]
	if sh.queues[mainQ].pushed <= uint64(sh.allocated) || sh.ghostClock == 0 {
		t.Fatalf("main queued %d chunks of %d, the ghost ticked %d times: the workload made no pass of main", sh.queues[mainQ].pushed, sh.allocated, sh.ghostClock)
	}
	if sh.mainGap == 0 || sh.mainRound() == 0 {
		t.Errorf("main passed chunks, its round is not timed: gap %d, round %d", sh.mainGap, sh.mainRound())
	}
	checkShards(t, s)
}

// TestWalkMeetsTurnAgain drives, one policy step at a time, a chunk that a
// walk visited in probation through main until it turns a second time, with
// entries of probation the walk had not reached yet promoted into it
// meanwhile: the walk meets it turning, its older span holding those
// entries, which it must visit. The steps are those a full shard takes
// (reserve's makeRoom and turn), called here on a shard of two chunks.
func TestWalkMeetsTurnAgain(t *testing.T) {
	s, sh, b := smallestStore(t)
	var keys [][]byte
	for i := 0; sh.allocated < 2 || sh.used[1] < 64<<10; i++ {
		e, key := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), 1, 3600, KindSuccess)
		s.Put(e, 0)
		keys = append(keys, key)
	}
	chunkOf := func(key []byte) (c, off int) {
		v := sh.table.load(sh.find(key, s.Hash(key)))
		return int(sh.table.loc(v) >> chunkBits), int(sh.table.loc(v) & (chunkSize - 1))
	}
	// The first half of the first chunk is asked again, so that main keeps
	// more than a turn passes at once, and a few entries of the second.
	var promoted [][]byte
	for _, key := range keys {
		switch c, off := chunkOf(key); {
		case c == 0 && off < 64<<10:
			s.touch(key)
		case c == 1 && len(promoted) < 10:
			s.touch(key)
			promoted = append(promoted, key)
		}
	}

	visited := map[string]bool{}
	visit := func(e entry.Entry) bool { visited[string(e.Key())] = true; return false }
	c, more := s.Walk(Cursor{}, visit) // the first chunk, probation's oldest
	if !more || len(visited) == 0 || visited[string(promoted[0])] {
		t.Fatalf("the walk's first step visited %d entries", len(visited))
	}

	var d Displaced
	sh.mu.Lock()
	sh.makeRoom(mainQ, 0, &d)      // the first chunk passes to main
	sh.makeRoom(probationQ, 0, &d) // the second passes, its hit entries promoted into the first
	sh.turn(mainQ, 64, 0, &d)      // main turns the first chunk, its oldest
	sh.mu.Unlock()
	if sh.turning[mainQ] != 0 {
		t.Fatalf("main turns chunk %d, want 0", sh.turning[mainQ])
	}
	for _, key := range promoted {
		if c, off := chunkOf(key); c != 0 || off < sh.oldStart[mainQ] {
			t.Fatalf("%s is at %d in chunk %d, not in the older span of chunk 0, from %d", dnsName(key), off, c, sh.oldStart[mainQ])
		}
	}

	for more {
		c, more = s.Walk(c, visit)
	}
	for _, key := range promoted {
		if !visited[string(key)] {
			t.Errorf("%s, stored before the walk and there after it, was not visited", dnsName(key))
		}
	}
	checkShards(t, s)
}

// smallestStore returns a store of one shard and twice the least budget, whose
// few chunks a test fills and turns in a few thousand puts, its shard and
// a builder of entries.
func smallestStore(t *testing.T) (*Store, *shard, *entry.Builder) {
	t.Helper()
	s, err := newStoreOn(1, 2*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s, &s.shards[0], entry.NewBuilder()
}
