package compactcache

import (
	"github.com/compactcache/compactcache/internal/entry"

	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// filledStore returns the arenas of a store filled past minMappedTable in
// every shard, and the bytes they should have mapped; the store itself is
// unreachable once it returns.
func filledStore(t *testing.T) ([]*arena, int64) {
	t.Helper()
	s, err := newStore(8*MinCapacity, perKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	for i := range 60_000 {
		e, _ := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), uint32(i), 3600, kindSuccess)
		s.put(e, 0)
	}
	checkShards(t, s)
	var arenas []*arena
	var want int64
	for i := range s.shards {
		sh := &s.shards[i]
		if len(sh.table)*8 < minMappedTable {
			t.Fatalf("shard %d: table of %d slots is on the heap; fill more", i, len(sh.table))
		}
		want += int64(len(sh.table)) * 8
		for _, c := range sh.chunks {
			if c != nil {
				want += chunkSize
			}
		}
		arenas = append(arenas, sh.arena)
	}
	return arenas, want
}

func mappedBy(arenas []*arena) (n int64) {
	for _, a := range arenas {
		n += a.mapped()
	}
	return n
}

// waitReleased runs GC cycles until the arenas hold nothing mapped.
func waitReleased(t *testing.T, arenas []*arena) {
	t.Helper()
	for range 100 {
		runtime.GC()
		if mappedBy(arenas) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d bytes still mapped after the store became unreachable", mappedBy(arenas))
}

func TestArenaMapsWhatIsCountedAndReleasesIt(t *testing.T) {
	if !mapsMemory {
		t.Skip("arenas are on the Go heap in this build")
	}
	arenas, want := filledStore(t)
	got := mappedBy(arenas)
	if got != want {
		t.Fatalf("%d bytes mapped, the store counts %d in chunks and tables", got, want)
	}
	if total := OffHeapBytes(); total < got {
		t.Fatalf("OffHeapBytes() = %d, less than this store's %d", total, got)
	}
	waitReleased(t, arenas)
}

// TestArenaKeptWhileShardHeld holds a shard, as a request does from
// store.shard to its Unlock, with nothing else referring to the store, and
// reads entries across GC cycles: the memory must stay mapped (unmapped, the
// reads would fault) until the shard is dropped too.
func TestArenaKeptWhileShardHeld(t *testing.T) {
	if !mapsMemory {
		t.Skip("arenas are on the Go heap in this build")
	}
	s, err := newStore(8*MinCapacity, perKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	e, key := testEntry(t, b, "held.example.org.", 7, 3600, kindSuccess)
	s.put(e, 0)
	h := s.hash(key)
	sh := s.shard(h)
	arenas := []*arena{sh.arena}
	s = nil

	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // cleanups run on a goroutine of their own
		sh.mu.Lock()
		e := sh.get(key, h)
		if e == nil {
			sh.mu.Unlock()
			t.Fatal("entry gone while its shard is held")
		}
		var r entry.Record
		e.Record(e.RecordsStart(), &r)
		v := r.Rdata[3]
		sh.mu.Unlock()
		if v != 7 {
			t.Fatalf("read %d from the held shard, stored 7", v)
		}
		if mappedBy(arenas) == 0 {
			t.Fatal("the shard's memory was released while the shard is held")
		}
	}
	runtime.KeepAlive(sh)
	sh = nil
	waitReleased(t, arenas)
}

// TestReloadWhileServing restarts a serving CoreDNS while clients keep
// asking the old and new instances: every other restart changes the budget,
// so the old store is dropped while requests may still be inside it, and
// the others hand the store over. GC cycles run throughout, so that a store
// released too early would fault under a request (run it also with -race,
// which checks the locking on heap arenas).
func TestReloadWhileServing(t *testing.T) {
	u := exampleUpstream()
	up := startUpstream(t, u)
	block := func(capacity int) string {
		return fmt.Sprintf(".:0 {\n\tbind 127.0.0.1\n\tcompactcache {\n\t\tcapacity %dMiB\n\t}\n\tforward . %s\n}", capacity, up)
	}
	serverMu.Lock()
	inst, err := caddy.Start(corefileInput(block(16)))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { inst.Stop() }()
	var addr atomic.Value
	addr.Store(inst.Servers()[0].LocalAddr().String())

	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg      sync.WaitGroup
		answers atomic.Int64
		wrong   atomic.Value
	)
	cases := []struct {
		req     *dns.Msg
		rcode   int
		answers int
	}{
		{test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), dns.RcodeSuccess, 2},
		{test.Case{Qname: "t.example.org.", Qtype: dns.TypeTXT}.Msg(), dns.RcodeSuccess, 1},
		{test.Case{Qname: "missing.example.org.", Qtype: dns.TypeA}.Msg(), dns.RcodeNameError, 0},
	}
	for g := range 4 {
		wg.Go(func() {
			c := &dns.Client{Timeout: time.Second}
			for i := g; ctx.Err() == nil; i++ {
				tc := cases[i%len(cases)]
				r, _, err := c.Exchange(tc.req.Copy(), addr.Load().(string))
				if err != nil {
					continue // an instance stopping mid-exchange
				}
				if r.Rcode != tc.rcode || len(r.Answer) != tc.answers {
					wrong.Store(fmt.Sprintf("%s: %v", tc.req.Question[0].Name, r))
				}
				answers.Add(1)
			}
		})
	}
	for i := range 10 {
		time.Sleep(50 * time.Millisecond)
		capacity := 16 << (i / 2 % 2) // 32, 32, 16, 16, ...: changes every other time
		serverMu.Lock()
		inst, err = inst.Restart(corefileInput(block(capacity)))
		serverMu.Unlock()
		if err != nil {
			cancel()
			wg.Wait()
			t.Fatal(err)
		}
		addr.Store(inst.Servers()[0].LocalAddr().String())
		runtime.GC()
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	wg.Wait()
	if w := wrong.Load(); w != nil {
		t.Fatalf("wrong reply: %v", w)
	}
	if answers.Load() < 100 {
		t.Fatalf("%d answers over the reloads; the servers did not serve", answers.Load())
	}
}
