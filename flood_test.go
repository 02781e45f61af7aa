package compactcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestFloodStaysInBudget drives a stream of distinct names through a 32 MiB
// budget, every twentieth query going to a hot set of 1,000 names asked a
// few times before, and samples as it goes:
//
//   - after every query, the store's accounted bytes (Stats().Bytes) are at
//     most its budget (Stats().Capacity);
//   - every so often, after runtime.GC(), the Go heap's HeapInuse (spans in
//     use: live objects plus their fragmentation, the larger of HeapInuse and
//     HeapAlloc) has grown by at most the budget plus 16 MiB over what it was
//     before the cache was made;
//   - the hot names are answered from the cache at least 99.9% of the time
//     over the flood, and 95% in every window between samples (scan
//     resistance), counted at the upstream: a hot query that reaches it is a
//     miss, but for its first and those after its entry expired.
//
// The full flood is 5 million names answered with one A record each, about
// 12 times what the budget holds:
//
//	COMPACTCACHE_FLOOD=5000000 go test -count=1 -run Flood -v -timeout 1h .
//
// By default it runs 400,000 names answered with TXT records of 64 B to 4 KB
// (2 KB on average), about 25 times what the budget holds, the hot names with
// 1 KB each; under -race (as in .ci/run), 80,000 names, 5 times the budget.
// COMPACTCACHE_FLOOD_TXT=BYTES answers every name with a TXT record of that
// size instead of an A record (0: A).
func TestFloodStaysInBudget(t *testing.T) {
	shape := floodShape{names: 400_000, txt: 1000, sized: true}
	if raceEnabled {
		shape.names = 80_000
	}
	if v := os.Getenv("COMPACTCACHE_FLOOD"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10_000 {
			t.Fatalf("COMPACTCACHE_FLOOD=%q: want a number of names, at least 10000", v)
		}
		shape = floodShape{names: n}
	}
	if v := os.Getenv("COMPACTCACHE_FLOOD_TXT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 60_000 {
			t.Fatalf("COMPACTCACHE_FLOOD_TXT=%q: want a TXT size in bytes up to 60000, 0 for A records", v)
		}
		shape.txt, shape.sized = n, false
	}
	if testing.Short() && shape.names > 400_000 {
		t.Skip("the full flood is not short")
	}
	const (
		hotNames   = floodHotNames
		hotWarm    = 3     // asks of each hot name before the flood
		hotEvery   = 20    // one query in hotEvery goes to the hot set
		samples    = 50    // hit-rate windows
		gcEvery    = 5     // samples between heap measurements
		minHitRate = 0.95  // in every window
		minOverall = 0.999 // over the flood
		heapSlack  = 16 << 20
	)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseInuse, baseAlloc := ms.HeapInuse, ms.HeapAlloc

	c := mustParse(t, "compactcache {\n\tcapacity 32MiB\n}")
	clk := newClock()
	c.now = clk.now
	c.SetRawWrites(true)
	up := &floodUpstream{shape: shape}
	up.now = clk.now
	c.Next = up
	budget := c.Stats().Capacity
	if budget != 32<<20 {
		t.Fatalf("capacity %d, want 32 MiB", budget)
	}

	w := &floodWriter{ResponseWriter: test.ResponseWriter{TCP: true}}
	req := new(dns.Msg)
	req.Question = []dns.Question{{Qclass: dns.ClassINET, Qtype: shape.qtype()}}
	var name []byte
	serve := func(i int, hot bool, check bool) {
		name = appendFloodName(name[:0], i, hot)
		req.Id = uint16(i)
		req.Question[0].Name = string(name)
		w.check, w.got = check, nil
		if _, err := c.ServeDNS(context.Background(), w, req); err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		if w.writes != 1 {
			t.Fatalf("query %s: %d replies written", name, w.writes)
		}
		w.writes = 0
		if check {
			if err := shape.checkReply(w.got, req); err != nil {
				t.Fatalf("query %s: %v", name, err)
			}
		}
		if s := c.Stats(); s.Bytes > s.Capacity {
			t.Fatalf("query %d: the store holds %d bytes, over its budget of %d", i, s.Bytes, s.Capacity)
		}
	}

	// Warm the hot set: each hot name asked a few times, as names are
	// before a flood starts; the first query of each is a miss.
	for range hotWarm {
		for h := range hotNames {
			serve(h, true, true)
		}
	}
	if n := up.hot.Load(); n != hotNames {
		t.Fatalf("warming %d hot names asked upstream %d times", hotNames, n)
	}

	start := time.Now()
	per := shape.names / samples
	var (
		cold, hotQueries, hotBefore, missBefore int64
		expiredBefore                           int64
		worstRate                               = 1.0
		peakInuse, peakAlloc                    uint64
		filledAt                                = -1
	)
	// A hot name's entry expires an hour after it was stored: that miss is
	// not an eviction and does not count against the hit rate.
	hotMisses := func() int64 { return up.hot.Load() - hotNames - up.expired }
	for i := 0; cold < int64(shape.names); i++ {
		// Advance the fake clock one second every 1,000 queries: the
		// full flood outlives the records' TTL of an hour, so entries
		// expire as well as being pushed out.
		if i%1000 == 999 {
			clk.advance(time.Second)
		}
		if i%hotEvery == hotEvery-1 {
			serve(int(hotQueries)%hotNames, true, i%997 == 0)
			hotQueries++
		} else {
			serve(int(cold), false, i%997 == 0)
			cold++
		}
		if cold%int64(per) != 0 || i%hotEvery == hotEvery-1 {
			continue
		}
		sample := int(cold) / per
		s := c.Stats()
		// Filled: the store has begun to evict.
		if filledAt < 0 && s.Entries < cold+hotNames {
			filledAt = sample
		}
		window := hotQueries - hotBefore - (up.expired - expiredBefore)
		rate := 1 - float64(hotMisses()-missBefore)/float64(window)
		worstRate = min(worstRate, rate)
		if rate < minHitRate {
			t.Errorf("sample %d (%d names): hot hit rate %.4f over the last %d hot queries, want > %.2f",
				sample, cold, rate, window, minHitRate)
		}
		hotBefore, missBefore, expiredBefore = hotQueries, hotMisses(), up.expired
		if sample%gcEvery != 0 && sample != samples {
			continue
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		inuse, alloc := ms.HeapInuse-min(ms.HeapInuse, baseInuse), ms.HeapAlloc-min(ms.HeapAlloc, baseAlloc)
		peakInuse, peakAlloc = max(peakInuse, inuse), max(peakAlloc, alloc)
		t.Logf("sample %2d: %8d names, %7d entries, store %5.1f MiB of %d MiB, heap in use +%5.1f MiB (alloc +%5.1f MiB), hot hit rate %.4f, %v",
			sample, cold, s.Entries, mib(s.Bytes), budget>>20, mib(int64(inuse)), mib(int64(alloc)), rate, time.Since(start).Round(time.Millisecond))
		if inuse > uint64(budget+heapSlack) {
			t.Errorf("sample %d: HeapInuse grew by %.1f MiB, over the budget plus 16 MiB (%.1f MiB)",
				sample, mib(int64(inuse)), mib(budget+heapSlack))
		}
	}
	s := c.Stats()
	if filledAt < 0 || filledAt > samples/5 {
		t.Errorf("the flood filled the store at sample %d of %d: too few names to test the budget", filledAt, samples)
	}
	if up.cold.Load() != cold {
		t.Errorf("%d cold names asked upstream %d times: each is new and must be asked once", cold, up.cold.Load())
	}
	overall := 1 - float64(hotMisses())/float64(hotQueries-up.expired)
	if overall < minOverall {
		t.Errorf("hot hit rate %.4f over the flood, want at least %.3f", overall, minOverall)
	}
	t.Logf("%d queries (%d cold names, %d hot queries over %d names) in %v: store filled by sample %d, %d entries at the end; "+
		"hot hit rate %.4f overall, %.4f worst window (%d hot misses on expiry left out); "+
		"heap growth peak: in use %.1f MiB, alloc %.1f MiB (budget %d MiB)",
		cold+hotQueries, cold, hotQueries, hotNames, time.Since(start).Round(time.Millisecond), filledAt, s.Entries,
		overall, worstRate, up.expired, mib(int64(peakInuse)), mib(int64(peakAlloc)), budget>>20)
	checkShards(t, c.store)
	t.Logf("store: %.1f MiB of %d MiB accounted", mib(s.Bytes), budget>>20)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// floodHotNames is the size of the flood's hot set: 1 MB of 1 KB entries,
// under a tenth of the budget, each asked once in 20,000 queries during the
// flood, farther apart than the flood turns the store's entries over (a
// ring with second chance, the store before S3-FIFO, answered 11% of them).
const floodHotNames = 1000

// floodShape is what the flood asks and what the upstream answers.
type floodShape struct {
	names int
	txt   int  // with txt > 0, names are asked for TXT and answered with txt bytes; else A
	sized bool // cold names answered with 64 B to 4 KB instead of txt bytes
}

func (f floodShape) qtype() uint16 {
	if f.txt > 0 {
		return dns.TypeTXT
	}
	return dns.TypeA
}

// record returns the answer to name, i's: an A record holding i, or a TXT
// record of f.txt bytes (for a cold name of a sized flood, 64 to 4,096)
// starting with i in decimal.
func (f floodShape) record(name string, i int, hot bool) dns.RR {
	hdr := dns.RR_Header{Name: name, Rrtype: f.qtype(), Class: dns.ClassINET, Ttl: 3600}
	if f.txt == 0 {
		a := make(net.IP, 4)
		binary.BigEndian.PutUint32(a, uint32(i))
		return &dns.A{Hdr: hdr, A: a}
	}
	size := f.txt
	if f.sized && !hot {
		size = 64 + i*7919%4033
	}
	// Strings of up to 240 bytes, each with its length byte, the first
	// starting with i.
	txt := &dns.TXT{Hdr: hdr}
	s := strconv.Itoa(i)
	for left := size; left > 1; s = "" {
		s += strings.Repeat("x", max(0, min(left-1, 240)-len(s)))
		txt.Txt = append(txt.Txt, s)
		left -= len(s) + 1
	}
	return txt
}

// checkReply fails unless got answers req with the record of its name.
func (f floodShape) checkReply(got, req *dns.Msg) error {
	if got == nil {
		return fmt.Errorf("no reply")
	}
	if got.Id != req.Id || got.Rcode != dns.RcodeSuccess || len(got.Question) != 1 || got.Question[0] != req.Question[0] {
		return fmt.Errorf("reply %v does not answer %v", got.MsgHdr, req.Question[0])
	}
	name := req.Question[0].Name
	i, hot := floodIndex(name)
	want := f.record(name, i, hot)
	if len(got.Answer) != 1 || !dns.IsDuplicate(got.Answer[0], want) {
		return fmt.Errorf("answer %v, want %v", got.Answer, want)
	}
	return nil
}

// appendFloodName appends the name of cold name i, or of hot name i.
func appendFloodName(b []byte, i int, hot bool) []byte {
	if hot {
		b = append(b, 'h')
	} else {
		b = append(b, 'c')
	}
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, ".flood.test."...)
}

// floodIndex returns the number in a flood name and whether it is hot.
func floodIndex(name string) (int, bool) {
	label, _, _ := strings.Cut(name, ".")
	i, _ := strconv.Atoi(label[1:])
	return i, label[0] == 'h'
}

// floodUpstream answers every flood name with its record, counting the hot
// and cold names it is asked for, and the hot names asked again because
// their entry expired. The flood asks from one goroutine: fetched and
// expired are not shared.
type floodUpstream struct {
	shape     floodShape
	now       func() time.Time
	hot, cold atomic.Int64
	fetched   [floodHotNames]int64 // unix seconds of each hot name's last fetch
	expired   int64
}

func (u *floodUpstream) Name() string { return "flood" }

func (u *floodUpstream) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	name := r.Question[0].Name
	i, hot := floodIndex(name)
	if hot {
		u.hot.Add(1)
		now := u.now().Unix()
		if last := u.fetched[i]; last != 0 && now-last >= 3600 {
			u.expired++
		}
		u.fetched[i] = now
	} else {
		u.cold.Add(1)
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.Answer = []dns.RR{u.shape.record(name, i, hot)}
	return dns.RcodeSuccess, w.WriteMsg(m)
}

// floodWriter takes replies, unpacking them only when asked to check.
type floodWriter struct {
	test.ResponseWriter
	check  bool
	got    *dns.Msg
	writes int
}

func (w *floodWriter) Write(b []byte) (int, error) {
	w.writes++
	if w.check {
		w.got = new(dns.Msg)
		if err := w.got.Unpack(b); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (w *floodWriter) WriteMsg(m *dns.Msg) error {
	w.writes++
	if w.check {
		b, err := m.Pack()
		if err != nil {
			return err
		}
		w.got = new(dns.Msg)
		return w.got.Unpack(b)
	}
	return nil
}
