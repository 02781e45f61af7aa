package compactcache

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// insertPool is how many distinct entries the insert benchmarks cycle
// through: a fresh cache takes over when they are all stored, so that every
// query timed is a miss.
const insertPool = 1 << 15

// workloadReplies returns the replies and keys of the first n entries of the
// reference workload (plain variant).
func workloadReplies(tb testing.TB, n int) ([]*dns.Msg, [][]byte) {
	tb.Helper()
	msgs, keys := make([]*dns.Msg, n), make([][]byte, n)
	for i := range msgs {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
		if err != nil {
			tb.Fatal(err)
		}
		msgs[i], keys[i] = m, key
	}
	return msgs, keys
}

// BenchmarkBuild times packing an upstream reply into an entry: the records
// from their *dns.Msg fields to the entry's bytes, in the builder's reused
// buffers, the question name known as on the miss path.
func BenchmarkBuild(b *testing.B) {
	msgs, keys := workloadReplies(b, 1<<12)
	bld := entry.NewBuilder()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := i % len(msgs)
		if _, err := bld.Build(msgs[k], keys[k], msgs[k].Question[0].Name, 0, 3600, 0, 0, config.DefaultMaxEntry); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// cannedUpstream answers entry i's query with a reply it built beforehand,
// the question echoed: its own cost is close to nothing, so that a
// benchmark through it times the cache's share of a miss.
type cannedUpstream struct {
	replies []*dns.Msg
	next    int // the entry asked for
}

func (u *cannedUpstream) Name() string { return "canned" }

func (u *cannedUpstream) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	m := u.replies[u.next]
	m.Id, m.Question[0] = r.Id, r.Question[0]
	return dns.RcodeSuccess, w.WriteMsg(m)
}

// quietWriter is a UDP client's writer that drops replies, and whose
// addresses cost nothing (test.ResponseWriter parses them on every call).
type quietWriter struct{ test.ResponseWriter }

var quietAddr = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}

func (quietWriter) LocalAddr() net.Addr  { return quietAddr }
func (quietWriter) RemoteAddr() net.Addr { return quietAddr }

// BenchmarkMiss times the cache's own share of an insert: ServeDNS for a
// name it does not hold, the upstream request made, the reply classified,
// packed and stored, and the client's reply written from the entry, as bytes
// (raw) or as a *dns.Msg given to WriteMsg. cpu-ns/op is the process's CPU
// time per insert; the fresh caches made with the timer stopped count in it.
func BenchmarkMiss(b *testing.B) {
	msgs, _ := workloadReplies(b, insertPool)
	names := workload.NewNames(insertPool)
	byWrites(b, func(b *testing.B, raw bool) {
		up := &cannedUpstream{replies: msgs}
		newCache := func() *Cache {
			c := New()
			c.Next = up
			c.SetRawWrites(raw)
			return c
		}
		c := newCache()
		req := workload.NewRequest(0, workload.Plain)
		w := &quietWriter{}
		b.ReportAllocs()
		cpu := processCPU()
		i := 0
		for b.Loop() {
			k := i % insertPool
			if k == 0 && i > 0 {
				b.StopTimer()
				c = newCache()
				b.StartTimer()
			}
			up.next = k
			workload.SetRequest(req, k, workload.Plain, names.Name(k))
			if _, err := c.ServeDNS(context.Background(), w, req); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(processCPU()-cpu)/float64(i), "cpu-ns/op")
		if n := c.Stats().Entries; n == 0 {
			b.Fatal("nothing stored")
		}
	})
}

// BenchmarkClassify times the verdict on an upstream reply: cacheable, for
// how long.
func BenchmarkClassify(b *testing.B) {
	msgs, _ := workloadReplies(b, 1<<12)
	reqs := make([]*dns.Msg, len(msgs))
	for i, m := range msgs {
		reqs[i] = new(dns.Msg)
		reqs[i].Question = m.Question
		m.Extra[0].(*dns.OPT).SetDo() // upstreams echo the DO=1 the cache asks with
	}
	c := New()
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := i % len(msgs)
		if v := c.classify(msgs[k], reqs[k], now); !v.store {
			b.Fatalf("reply %d not stored: %s", k, v.why)
		}
		i++
	}
}

// byWrites runs f as a sub-benchmark for each way hits are written: as
// bytes (raw) and as a *dns.Msg given to WriteMsg.
func byWrites(b *testing.B, f func(b *testing.B, raw bool)) {
	for _, raw := range []bool{true, false} {
		name := "writemsg"
		if raw {
			name = "raw"
		}
		b.Run(name, func(b *testing.B) { f(b, raw) })
	}
}

// packingWriter is a UDP client's writer that packs what WriteMsg gets, as
// the server's writer does, and drops it.
type packingWriter struct {
	quietWriter
	buf []byte
}

func (w *packingWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.PackBuffer(w.buf)
	w.buf = b[:cap(b)]
	return err
}

func (w *packingWriter) Write(b []byte) (int, error) { return len(b), nil }

// BenchmarkPassOn times a reply the cache does not store on its way to the
// client (here every success, by `disable success .`): the upstream request,
// the verdict, and the client's reply written through the reply writer,
// to a writer that packs what it is given as a *dns.Msg.
func BenchmarkPassOn(b *testing.B) {
	msgs, _ := workloadReplies(b, insertPool)
	names := workload.NewNames(insertPool)
	byWrites(b, func(b *testing.B, raw bool) {
		up := &cannedUpstream{replies: msgs}
		c := New()
		c.Next, c.DisableSuccess = up, []string{"."}
		c.SetRawWrites(raw)
		req := workload.NewRequest(0, workload.Plain)
		w := &packingWriter{}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := i % insertPool
			up.next = k
			workload.SetRequest(req, k, workload.Plain, names.Name(k))
			if _, err := c.ServeDNS(context.Background(), w, req); err != nil {
				b.Fatal(err)
			}
			i++
		}
		if n := c.Stats().Entries; n != 0 {
			b.Fatalf("%d entries stored", n)
		}
	})
}
