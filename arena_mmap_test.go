//go:build linux && !race

package compactcache

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestArenaCollapsesFullHugePages hands out a ring's chunks and checks the
// kernel's account of its memory: small pages, no more resident than handed
// out, while a huge page's chunks are partly handed out; one huge page once
// they all are.
func TestArenaCollapsesFullHugePages(t *testing.T) {
	if thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(thp), "[never]") {
		t.Skip("transparent huge pages are off on this machine")
	}
	const chunksPerHuge = hugePage / chunkSize
	a := newArena(2 * chunksPerHuge)
	defer a.release()
	for i := range chunksPerHuge - 1 {
		c := a.chunk(i)
		c[0], c[len(c)-1] = 1, 1 // every chunk's first and last page resident
	}
	if rss, huge := residence(t, a.mapping); huge != 0 || rss > (chunksPerHuge-1)*chunkSize {
		t.Fatalf("%d of %d chunks handed out: %d bytes resident, %d in huge pages; want at most %d, none",
			chunksPerHuge-1, chunksPerHuge, rss, huge, (chunksPerHuge-1)*chunkSize)
	}
	a.chunk(chunksPerHuge - 1)
	// The collapse is done in the background.
	var rss, huge int
	for range 100 {
		if rss, huge = residence(t, a.mapping); huge == hugePage && rss == hugePage {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("a huge page of chunks handed out: %d bytes resident, %d in huge pages after 2s; want %d, all of them",
		rss, huge, hugePage)
}

// TestArenaLargeTableInHugePages maps a table of two huge pages, writes a
// slot in each, and checks that both are huge pages: all of the table
// resident, as the accounting counts it, and nothing more.
func TestArenaLargeTableInHugePages(t *testing.T) {
	if thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(thp), "[never]") {
		t.Skip("transparent huge pages are off on this machine")
	}
	a := newArena(1)
	defer a.release()
	slots := 2 * hugePage / 8
	tab := a.table(slots)
	tab[0], tab[slots-1] = 1, 1
	mt := a.tables[0]
	if rss, huge := residence(t, mt.mapping); huge != 2*hugePage || rss != 2*hugePage {
		t.Fatalf("a table of %d bytes, a slot written in each huge page: %d bytes resident, %d in huge pages; want all of it, in huge pages",
			2*hugePage, rss, huge)
	}
	if got := a.mapped(); got != 2*hugePage {
		t.Fatalf("the arena counts %d bytes for a table of %d", got, 2*hugePage)
	}
}

// residence returns the resident bytes, and those in huge pages, of the
// mappings /proc/self/smaps lists inside b.
func residence(t *testing.T, b []byte) (rss, huge int) {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	lo := uint64(uintptr(unsafe.Pointer(&b[0])))
	hi := lo + uint64(len(b))
	inside := false
	for line := range strings.Lines(string(smaps)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if start, end, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			s, err1 := strconv.ParseUint(start, 16, 64)
			e, err2 := strconv.ParseUint(end, 16, 64)
			inside = err1 == nil && err2 == nil && s >= lo && e <= hi
			continue
		}
		if !inside || len(f) < 2 {
			continue
		}
		kb, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Rss:":
			rss += kb << 10
		case "AnonHugePages:":
			huge += kb << 10
		}
	}
	return rss, huge
}
