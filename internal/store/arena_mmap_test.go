//go:build linux && !race

package store

import (
	"github.com/compactcache/compactcache/internal/entry"

	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestArenaCollapsesFullHugePages hands out a ring's chunks and checks the
// kernel's account of its memory: small pages, no more resident than handed
// out, while a huge page's chunks are partly handed out; one huge page once
// they all are.
func TestArenaCollapsesFullHugePages(t *testing.T) {
	requireHugePages(t, true)
	const chunksPerHuge = hugePage / chunkSize
	a := newArena(2*chunksPerHuge, nil)
	defer a.release()
	for i := range chunksPerHuge - 1 {
		c := a.chunk(i, chunkSize)
		c[0], c[len(c)-1] = 1, 1 // every chunk's first and last page resident
	}
	if rss, huge := residence(t, a.mapping); huge != 0 || rss > (chunksPerHuge-1)*chunkSize {
		t.Fatalf("%d of %d chunks handed out: %d bytes resident, %d in huge pages; want at most %d, none",
			chunksPerHuge-1, chunksPerHuge, rss, huge, (chunksPerHuge-1)*chunkSize)
	}
	a.chunk(chunksPerHuge-1, chunkSize)
	// The collapse is done in the background, once no store has grown for
	// collapseQuiet, or a collapseEvery after the collapser took the page:
	// pending until then.
	if n := HugePagesPending(); n < 1 {
		t.Fatalf("a huge page of chunks just handed out: %d huge pages pending, want at least 1", n)
	}
	var rss, huge int
	for range 150 {
		if rss, huge = residence(t, a.mapping); huge == hugePage && rss == hugePage {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("a huge page of chunks handed out: %d bytes resident, %d in huge pages after 3s; want %d, all of them",
		rss, huge, hugePage)
}

// TestFreedChunkKeepsItsPageSmall: a huge page a chunk was freed from is
// not advised huge again when its last chunk is handed out, which would let
// khugepaged collapse it, the freed chunk resident again and counted
// nowhere.
func TestFreedChunkKeepsItsPageSmall(t *testing.T) {
	const chunksPerHuge = hugePage / chunkSize
	a := newArena(chunksPerHuge, nil)
	defer a.release()
	for i := range chunksPerHuge - 1 {
		a.chunk(i, chunkSize)
	}
	a.freeChunk(3, chunkSize)
	a.chunk(chunksPerHuge-1, chunkSize)
	if flags := vmFlags(t, a.ring); strings.Contains(flags, " hg") {
		t.Errorf("the page a chunk was freed from is advised huge (VmFlags%s)", flags)
	}
}

// vmFlags returns the VmFlags /proc/self/smaps lists for the mappings
// inside b, each after a space.
func vmFlags(t *testing.T, b []byte) string {
	t.Helper()
	flags := ""
	smapsInside(t, b, func(f []string) {
		if f[0] == "VmFlags:" {
			flags += " " + strings.Join(f[1:], " ")
		}
	})
	return flags
}

// smapsInside calls line with the fields of each line /proc/self/smaps
// lists for the mappings inside b, their header lines left out.
func smapsInside(t *testing.T, b []byte, line func(f []string)) {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	lo := uint64(uintptr(unsafe.Pointer(&b[0])))
	hi := lo + uint64(len(b))
	inside := false
	for l := range strings.Lines(string(smaps)) {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if start, end, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			s, err1 := strconv.ParseUint(start, 16, 64)
			e, err2 := strconv.ParseUint(end, 16, 64)
			inside = err1 == nil && err2 == nil && s >= lo && e <= hi
			continue
		}
		if inside {
			line(f)
		}
	}
}

// TestChunksArePopulated: a chunk is resident whole when it is handed out,
// before anything is written to it, and nothing beyond it is; so is a table
// mapped alone in small pages.
func TestChunksArePopulated(t *testing.T) {
	probe, err := mmap(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	err = syscall.Madvise(probe, madvisePopulateWrite)
	syscall.Munmap(probe)
	if err != nil {
		t.Skipf("MADV_POPULATE_WRITE: %v (Linux 5.14 or later)", err)
	}
	a := newArena(2*hugePage/chunkSize, nil)
	defer a.release()
	a.chunk(0, chunkSize)
	a.chunk(1, minShortChunk)
	if rss, _ := residence(t, a.mapping); rss != chunkSize+minShortChunk {
		t.Errorf("chunks of %d and %d bytes handed out, nothing written: %d bytes resident", chunkSize, minShortChunk, rss)
	}
	a.table(minMappedTable)
	mt := a.tables[len(a.tables)-1]
	if rss, _ := residence(t, mt.mapping); rss != minMappedTable {
		t.Errorf("a table of %d bytes mapped alone, nothing written: %d bytes resident", minMappedTable, rss)
	}
}

// TestCollapseTurnWaitsOutGrowth: a collapse waits while stores hand out
// chunks, until collapseEvery after the last collapse or after the page was
// taken, whichever is later, and runs once none has been handed out for
// collapseQuiet, but not sooner after the last collapse than it took. The
// turns read a counter of their own: the stores of other tests move the
// process's, and a clock of their own: a busy machine must not make a
// growing store look quiet.
func TestCollapseTurnWaitsOutGrowth(t *testing.T) {
	cases := []struct {
		name    string
		grow    bool
		idle    time.Duration // since the last collapse
		took    time.Duration // the last collapse's duration
		atLeast time.Duration
		before  time.Duration
	}{
		{name: "quiet", atLeast: collapseQuiet, before: collapseEvery},
		{name: "growing", grow: true, atLeast: collapseEvery, before: 2 * collapseEvery},
		{name: "growing after an idle spell", grow: true, idle: time.Hour, atLeast: collapseEvery, before: 2 * collapseEvery},
		{name: "quiet after a long collapse", took: 3 * collapseQuiet / 2, atLeast: 3 * collapseQuiet / 2, before: collapseEvery},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var chunks atomic.Uint64
			chunks.Add(1) // a chunk just handed out
			// The turn's clock moves only when it sleeps; a growing store
			// hands out a chunk every twentieth of collapseQuiet of it.
			start := time.Unix(1e9, 0)
			now, nextChunk := start, start
			sleep := func(d time.Duration) {
				now = now.Add(d)
				for tc.grow && !nextChunk.After(now) {
					chunks.Add(1)
					nextChunk = nextChunk.Add(collapseQuiet / 20)
				}
			}
			turn := collapseTurn{growth: &chunks, last: start.Add(-tc.idle), took: tc.took,
				now: func() time.Time { return now }, sleep: sleep}
			turn.await(start)
			if d := now.Sub(start); d < tc.atLeast || d >= tc.before {
				t.Fatalf("the collapse waited %v; want %v to %v", d, tc.atLeast, tc.before)
			}
		})
	}
}

// TestCollapseTurnSkipsDroppedStores: the page of a store dropped since it
// was queued takes no turn; the page of a live store waits for its turn.
func TestCollapseTurnSkipsDroppedStores(t *testing.T) {
	// The last collapse took a second: the next turn is a second after it.
	const took = time.Second
	var chunks atomic.Uint64
	turn := collapseTurn{growth: &chunks, last: time.Now(), took: took, now: time.Now, sleep: time.Sleep}
	take := func(a *arena) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			turn.take(pendingCollapse{a: a})
			close(done)
		}()
		return done
	}
	dropped := newArena(hugePage/chunkSize, nil)
	dropped.chunk(0, chunkSize)
	dropped.release()
	select {
	case <-take(dropped):
	case <-time.After(took / 2):
		t.Fatal("the page of a dropped store waited for its turn")
	}
	live := newArena(hugePage/chunkSize, nil)
	defer live.release()
	live.chunk(0, chunkSize)
	turn.last = time.Now() // the turn is a second from here, whatever the set-up took
	done := take(live)
	select {
	case <-done:
		t.Fatal("the page of a live store was collapsed before its turn")
	case <-time.After(took / 2):
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the page of a live store is still waiting for its turn")
	}
}

// TestArenaLargeTableInHugePages maps a table of two huge pages, writes a
// byte in each, and checks that both are huge pages: all of the table
// resident, as the accounting counts it, and nothing more.
func TestArenaLargeTableInHugePages(t *testing.T) {
	requireHugePages(t, false)
	a := newArena(1, nil)
	defer a.release()
	tab := a.table(2 * hugePage)
	tab[0], tab[len(tab)-1] = 1, 1
	mt := a.tables[0]
	if rss, huge := residence(t, mt.mapping); huge != 2*hugePage || rss != 2*hugePage {
		t.Fatalf("a table of %d bytes, a byte written in each huge page: %d bytes resident, %d in huge pages; want all of it, in huge pages",
			2*hugePage, rss, huge)
	}
	if got := a.mapped(); got != 2*hugePage {
		t.Fatalf("the arena counts %d bytes for a table of %d", got, 2*hugePage)
	}
}

// TestSharedTablesShareHugePages has two shards of a large store map
// tables smaller than a huge page: they share one huge page, counted whole
// and taken out of the shards' budgets; a table handed out again is zeroed;
// past the pages the store may map, a table is mapped on its own; and the
// page is unmapped with the last table in it.
func TestSharedTablesShareHugePages(t *testing.T) {
	requireHugePages(t, false)
	if newSharedTables(minSharedTables-1) != nil {
		t.Fatalf("a store of %d bytes shares table pages: they would be a large share of its budget", minSharedTables-1)
	}
	s, err := New(minSharedTables, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := s.shards[0].arena.shared
	if st == nil || st != s.shards[len(s.shards)-1].arena.shared {
		t.Fatalf("a store of %d bytes: its shards do not share table pages", int64(minSharedTables))
	}
	if budgets := s.shards[0].budget * int64(len(s.shards)); budgets+st.reserve() > s.capacity || st.reserve() != int64(st.maxPages)*hugePage {
		t.Fatalf("shard budgets %d plus %d reserved for %d shared pages: more than the capacity %d", budgets, st.reserve(), st.maxPages, s.capacity)
	}

	a, b := newArena(1, st), newArena(1, st)
	const size = minMappedTable
	// OffHeapBytes is the process's: the stores earlier tests dropped are
	// unmapped first, so that only these arenas move it.
	settleOffHeap()
	before := OffHeapBytes()
	ta, tb := a.table(size), b.table(size)
	ta[0], tb[size-1] = 1, 1
	if len(st.regions) != 1 || st.pages != 1 || OffHeapBytes()-before != hugePage {
		t.Fatalf("two tables of %d bytes: %d regions, %d huge pages, %d bytes mapped; want 1, 1, %d",
			minMappedTable, len(st.regions), st.pages, OffHeapBytes()-before, hugePage)
	}
	page := st.regions[0].mapping
	if _, huge := residence(t, page); huge != hugePage {
		t.Fatalf("the shared page has %d bytes in huge pages; want %d", huge, hugePage)
	}
	if a.mapped() != minMappedTable || b.mapped() != minMappedTable {
		t.Fatalf("the arenas count %d and %d bytes for a table of %d each", a.mapped(), b.mapped(), minMappedTable)
	}

	a.free(ta)
	again := a.table(size)
	if again[0] != 0 || st.pages != 1 {
		t.Fatalf("a table handed out again: first byte %d, %d pages; want 0, 1", again[0], st.pages)
	}
	st.maxPages = st.pages
	own := b.table(2 * size)
	if st.pages != 1 || b.tables[len(b.tables)-1].region != nil || b.mapped() != 3*minMappedTable {
		t.Fatalf("a table past the shared pages: %d pages, shared %v, %d bytes counted; want 1, on its own, %d",
			st.pages, b.tables[len(b.tables)-1].region != nil, b.mapped(), 3*minMappedTable)
	}
	own[0] = 1
	mapped := OffHeapBytes()
	a.release()
	b.release()
	if unmapped := mapped - OffHeapBytes(); len(st.regions) != 0 || st.pages != 0 || a.mapped() != 0 || b.mapped() != 0 || unmapped != hugePage+2*minMappedTable {
		t.Fatalf("after release: %d regions, %d pages, %d and %d bytes counted, %d unmapped; want none, %d unmapped",
			len(st.regions), st.pages, a.mapped(), b.mapped(), unmapped, hugePage+2*minMappedTable)
	}
	if rss, _ := residence(t, page); rss != 0 {
		t.Fatalf("after release the page has %d bytes resident", rss)
	}
}

// requireHugePages skips t where the kernel gives a mapping advised for
// huge pages none at its first write (THP off, none free), or, with
// collapse, cannot collapse small pages into one (MADV_COLLAPSE needs
// Linux 6.1).
func requireHugePages(t *testing.T, collapse bool) {
	t.Helper()
	m, page, err := mapHugeAligned(hugePage, syscall.MADV_HUGEPAGE)
	if err != nil {
		t.Skipf("cannot map a huge page: %v", err)
	}
	defer syscall.Munmap(m)
	page[0] = 1
	if _, huge := residence(t, m); huge != hugePage {
		t.Skip("no transparent huge page at fault time on this machine")
	}
	if !collapse {
		return
	}
	// Small pages of their own, to collapse.
	m2, small, err := mapHugeAligned(hugePage, syscall.MADV_NOHUGEPAGE)
	if err != nil {
		t.Skipf("cannot map a huge page's worth: %v", err)
	}
	defer syscall.Munmap(m2)
	for i := 0; i < len(small); i += 4096 {
		small[i] = 1
	}
	if err := syscall.Madvise(small, syscall.MADV_HUGEPAGE); err != nil {
		t.Skipf("MADV_HUGEPAGE: %v", err)
	}
	if err := syscall.Madvise(small, madviseCollapse); err != nil {
		t.Skipf("MADV_COLLAPSE: %v", err)
	}
}

// TestDroppedStoresReleasedWithoutHeapGrowth: stores made and dropped while
// the heap grows too little for a collection, as in a fuzzer's loop, are
// still unmapped, as the rings they reserve start cycles themselves.
func TestDroppedStoresReleasedWithoutHeapGrowth(t *testing.T) {
	settleOffHeap()
	// A large live heap puts off the cycle that the stores' own allocations
	// would start.
	ballast := make([]byte, 512<<20)
	defer runtime.KeepAlive(ballast)
	runtime.GC()
	before := OffHeapBytes()
	e, _ := testEntry(t, entry.NewBuilder(), "a.example.org.", 1, 3600, KindSuccess)
	const stores = 4 * ringsPerCycle
	for range stores {
		s, err := New(MinCapacity, PerKind{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.shards) != 1 {
			t.Fatalf("a store of MinCapacity has %d shards, want 1", len(s.shards))
		}
		s.Put(e, 0) // reserves the shard's ring, and writes a chunk of it
	}
	// Had no cycle run, every store would still hold its chunk.
	const most = 2 * ringsPerCycle * chunkSize
	deadline := time.Now().Add(10 * time.Second)
	for OffHeapBytes()-before > most && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if held := OffHeapBytes() - before; held > most {
		t.Fatalf("%d dropped stores hold %d bytes off the heap, want at most %d", stores, held, most)
	}
}

// settleOffHeap runs GC cycles until the cleanups of unreachable stores
// stop changing OffHeapBytes.
func settleOffHeap() {
	mapped := OffHeapBytes()
	for range 20 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond) // cleanups run on a goroutine of their own
		now := OffHeapBytes()
		if now == mapped {
			return
		}
		mapped = now
	}
}

// residence returns the resident bytes, and those in huge pages, of the
// mappings /proc/self/smaps lists inside b.
func residence(t *testing.T, b []byte) (rss, huge int) {
	t.Helper()
	smapsInside(t, b, func(f []string) {
		if len(f) < 2 {
			return
		}
		kb, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Rss:":
			rss += kb << 10
		case "AnonHugePages:":
			huge += kb << 10
		}
	})
	return rss, huge
}

// TestSharedTablesWithinBudget fills a store whose tables share huge pages
// well past its budget: the pages stay within the number set aside for
// them, and the memory mapped for the store, table pages counted whole,
// within its capacity.
func TestSharedTablesWithinBudget(t *testing.T) {
	before := OffHeapBytes()
	s, err := New(minSharedTables, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := s.shards[0].arena.shared
	b := entry.NewBuilder()
	label := strings.Repeat("x", 60)
	shared, evicted := false, 0
	for i := range 320_000 {
		// Long names, so that the budget fills in fewer puts.
		e, _ := testEntry(t, b, fmt.Sprintf("%s.%s.%s.n%d.example.org.", label, label, label, i), uint32(i), 3600, KindSuccess)
		ev := s.Put(e, 0)
		evicted += ev.Evicted[KindSuccess] + ev.Refused[KindSuccess]
		if i%1000 == 0 && !shared {
			for j := range s.shards {
				if ts := s.shards[j].arena.tables; len(ts) > 0 && ts[len(ts)-1].region != nil {
					shared = true
				}
			}
		}
	}
	checkShards(t, s)
	if !shared {
		t.Fatal("no table came from the shared pages")
	}
	if evicted == 0 {
		t.Fatalf("320000 entries fit in %d bytes: the budget was never reached", s.capacity)
	}
	if st.pages > st.maxPages {
		t.Fatalf("%d shared pages mapped, %d set aside", st.pages, st.maxPages)
	}
	if held, limit := s.Usage().Held, s.capacity-st.reserve(); held > limit {
		t.Fatalf("the shards hold %d bytes, more than the %d the reserve leaves them", held, limit)
	}
	if mapped := OffHeapBytes() - before; mapped > s.capacity {
		t.Fatalf("%d bytes mapped for a store of %d", mapped, s.capacity)
	}
}

// TestRegionPages checks the regions tables of each size go in: the fewest
// huge pages that hold a whole number of them, and no more tables than a
// region's bitmask has bits.
func TestRegionPages(t *testing.T) {
	const k = 1 << 10
	tests := []struct {
		size, pages, tables int
		inRegions           bool
	}{
		{64 * k, 1, 32, true},
		{256 * k, 1, 8, true},
		{1024 * k, 1, 2, true},
		{768 * k, 3, 8, true},
		{1280 * k, 5, 8, true},
		{1536 * k, 3, 4, true},
		{1792 * k, 7, 8, true},
		{320 * k, 5, 32, true},  // 5 * 64 KiB
		{1152 * k, 9, 16, true}, // 9 * 128 KiB
		{32 * k, 1, 64, false},  // more tables than bits
		{96 * k, 3, 64, false},
		{2048 * k, 1, 1, false}, // a huge page: mapped alone
	}
	for _, tt := range tests {
		pages := regionPages(tt.size)
		if tables := pages * hugePage / tt.size; pages != tt.pages || tables != tt.tables || tables*tt.size != pages*hugePage {
			t.Errorf("tables of %d KiB: regions of %d huge pages holding %d; want %d holding %d", tt.size/k, pages, tables, tt.pages, tt.tables)
		}
		if got := inRegions(tt.size); got != tt.inRegions {
			t.Errorf("inRegions(%d KiB) = %v, want %v", tt.size/k, got, tt.inRegions)
		}
	}
	for n := minMappedTable; n < hugePage; n = tableSizeAfter(n) {
		if !inRegions(n) {
			t.Errorf("tables of %d bytes, a size tableSizeAfter makes, are not held in regions", n)
		}
	}
}

// TestMapsAloneWhenRegionsFull: a table meant for the shared regions is
// mapped alone once they have no room for it, and mapsAlone says so before
// the resize, so that the shard counts the old table beside it.
func TestMapsAloneWhenRegionsFull(t *testing.T) {
	const size = 5 * hugePage / 8 // 1.25 MiB: eight to a region of five pages
	st := &sharedTables{maxPages: 5}
	var arenas []*arena
	defer func() {
		for _, a := range arenas {
			a.release()
		}
	}()
	for i := range 9 {
		a := newArena(1, st)
		arenas = append(arenas, a)
		alone := a.mapsAlone(size)
		if want := i == 8; alone != want {
			t.Fatalf("%d tables in the regions: mapsAlone = %v, want %v", i, alone, want)
		}
		a.table(size)
		if inRegion := a.tables[0].region != nil; inRegion == alone {
			t.Fatalf("table %d: in a region %v, where mapsAlone said %v", i, inRegion, alone)
		}
	}
	if got := arenas[0].mapsAlone(hugePage); !got {
		t.Error("a table of a huge page is not mapped alone")
	}
}

// TestRegionTakeAndPut hands out the tables of 1.25 MiB of eight arenas and
// a ninth, and takes them back: the eight fill one region of five huge pages,
// each page counted once the first table in it is handed out, the ninth
// maps a second region; a page no table lies in any more is given back, and
// a region unmapped with its last table, until nothing is counted.
func TestRegionTakeAndPut(t *testing.T) {
	const size = 5 * hugePage / 8
	st := &sharedTables{maxPages: 16}
	settleOffHeap()
	before := OffHeapBytes()
	var arenas []*arena
	var tables [][]byte
	// A table spans one page or two; the page counts after each take.
	for i, pages := range []int{1, 2, 2, 3, 4, 4, 5, 5, 6} {
		a := newArena(1, st)
		tab := a.table(size)
		tab[0], tab[size-1] = 1, 1
		arenas, tables = append(arenas, a), append(tables, tab)
		if a.tables[0].region == nil || a.mapped() != size {
			t.Fatalf("table %d: in a region %v, %d bytes counted; want in one, %d", i, a.tables[0].region != nil, a.mapped(), size)
		}
		if st.pages != pages || OffHeapBytes()-before != int64(pages)*hugePage {
			t.Fatalf("%d tables handed out: %d pages counted, %d bytes mapped; want %d pages", i+1, st.pages, OffHeapBytes()-before, pages)
		}
	}
	if len(st.regions) != 2 || st.regions[0].used != 0xff || st.regions[1].used != 1 {
		t.Fatalf("nine tables of 1.25 MiB: %d regions; want the first full, the second holding one", len(st.regions))
	}
	region := st.regions[0].region
	for i := range 8 {
		if &region[i*size] != &tables[i][0] {
			t.Fatalf("table %d does not lie at its place in the region", i)
		}
	}

	// The order they are taken back in, and the pages counted after each.
	steps := []struct{ table, pages int }{
		{8, 5}, // the second region's last table: unmapped
		{1, 5}, // its pages hold tables 0 and 2
		{0, 4}, // page 0 holds none now
		{3, 4},
		{2, 3}, // page 1
		{7, 3},
		{5, 3},
		{6, 2}, // page 4
		{4, 0}, // the region's last: unmapped
	}
	for _, s := range steps {
		arenas[s.table].release()
		if st.pages != s.pages || OffHeapBytes()-before != int64(s.pages)*hugePage || arenas[s.table].mapped() != 0 {
			t.Fatalf("table %d taken back: %d pages counted, %d bytes mapped, %d in its arena; want %d pages, none",
				s.table, st.pages, OffHeapBytes()-before, arenas[s.table].mapped(), s.pages)
		}
		if len(st.regions) > 0 {
			rss, _ := residence(t, region)
			if want := st.pages * hugePage; rss > want {
				t.Fatalf("table %d taken back: %d bytes of the region resident, %d counted", s.table, rss, want)
			}
		}
	}
	if len(st.regions) != 0 {
		t.Fatalf("every table taken back: %d regions left mapped", len(st.regions))
	}
}

// TestRegionTablesInHugePages has eight shards take tables of 1.25 MiB and
// write them: the region's five pages are all resident, in huge pages.
func TestRegionTablesInHugePages(t *testing.T) {
	requireHugePages(t, false)
	st := &sharedTables{maxPages: 8}
	for range 8 {
		a := newArena(1, st)
		defer a.release()
		tab := a.table(5 * hugePage / 8)
		for i := range tab {
			tab[i] = 1
		}
	}
	if len(st.regions) != 1 || st.pages != 5 {
		t.Fatalf("eight tables of 1.25 MiB: %d regions, %d pages; want 1, 5", len(st.regions), st.pages)
	}
	if rss, huge := residence(t, st.regions[0].mapping); rss != 5*hugePage || huge != 5*hugePage {
		t.Fatalf("a region of five huge pages: %d bytes resident, %d in huge pages; want all of it, in huge pages", rss, huge)
	}
}

// TestSharedTablesHoldAStep has the eight shards of a store of 512 MiB
// grow their tables from 64 KiB to 1.25 MiB in turn, in many orders, each
// new table handed out before the old one is taken back, as resize does:
// the old size's pages and the new size's fit in the pages set aside, so
// that every table lies in a region throughout.
func TestSharedTablesHoldAStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		st := newSharedTables(512 << 20)
		arenas := make([]*arena, 8)
		tables := make([][]byte, 8)
		for i := range arenas {
			arenas[i] = newArena(1, st)
		}
		for n := minMappedTable; n <= 5*hugePage/8; n = tableSizeAfter(n) {
			for _, i := range rng.Perm(len(arenas)) {
				a := arenas[i]
				next := a.table(n)
				if a.tables[len(a.tables)-1].region == nil {
					t.Fatalf("round %d: a table of %d bytes mapped alone, %d of %d pages counted", round, n, st.pages, st.maxPages)
				}
				if tables[i] != nil {
					a.free(tables[i])
				}
				tables[i] = next
			}
		}
		if st.pages != 5 {
			t.Fatalf("round %d: eight tables of 1.25 MiB in %d pages, want 5", round, st.pages)
		}
		for _, a := range arenas {
			a.release()
		}
		if st.pages != 0 || len(st.regions) != 0 {
			t.Fatalf("round %d: released, %d pages counted, %d regions left", round, st.pages, len(st.regions))
		}
	}
}

// TestShardAtBudgetAsksNoRegions: a shard at its budget, whose table stays
// past growLoad, learns that it may not grow without asking the shared
// regions, whose lock every shard of the store takes.
func TestShardAtBudgetAsksNoRegions(t *testing.T) {
	s, err := New(64<<20, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	putNames(t, s, 40_000)
	sh := &s.shards[0]
	if next := tableSizeAfter(len(sh.table.b)); sh.arena.placeOf(next) != inRegion {
		t.Fatalf("the next table, of %d bytes, is not meant for the regions: fill less", next)
	}
	sh.budget = sh.held
	st := sh.arena.shared
	st.mu.Lock()
	done := make(chan bool, 1)
	go func() { done <- sh.mayGrow() }()
	select {
	case grows := <-done:
		if grows {
			t.Error("a shard at its budget may grow its table")
		}
	case <-time.After(time.Second):
		t.Error("a shard at its budget waited for the regions' lock to learn that its table may not grow")
	}
	st.mu.Unlock()
}
