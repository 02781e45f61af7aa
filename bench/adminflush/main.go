//go:build linux

// Command adminflush measures what a subtree flush through the admin
// endpoint costs the queries answered meanwhile: the latency of hits at a
// fixed rate while flush_zone removes a million entries, against the same
// load without the flush.
//
//	go run ./bench/adminflush                       # 1M entries, 10,000 q/s, a round of about 75 s
//	go run ./bench/adminflush -names 100000 -duration 5s   # a quick look
//	nice -n -15 taskset -c 1 go run ./bench/adminflush -rounds 5 -cpu 0 -nice -15   # BENCHMARKS.md's, as root
//
// It builds cmd/coredns (or takes -binary), starts it on 127.0.0.1 with
// compactcache (capacity -capacity, the admin endpoint on) in front of an
// upstream served from this process, which answers every A question. It
// fills -names entries under flush.example and -hot under hot.example
// (misses, as fast as the server takes them), then asks the hot names at
// -rate q/s, open loop (each query sent on its schedule, whether earlier
// ones were answered or not), for -duration: the baseline. Then the same
// load again, and after 2 s flush_zone flush.example; latencies of the
// queries sent while the flush ran are compared with the baseline's: their
// p99 over the baseline's, and over the median p99 of the baseline's
// stretches as long as the flush (as many queries; the median keeps out
// the baseline's own spikes on a shared machine). It prints a line per
// phase and the ratios, and over several rounds the median of the first.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/admin"
	"github.com/miekg/dns"
)

const cmd = harness.Command("adminflush")

func main() {
	var (
		names    = flag.Int("names", 1_000_000, "entries under flush.example, which the flush removes")
		hot      = flag.Int("hot", 10_000, "names under hot.example that the load asks (hits)")
		rate     = flag.Int("rate", 10_000, "queries per second of the load")
		duration = flag.Duration("duration", 10*time.Second, "how long each load phase runs at least")
		capacity = flag.String("capacity", "512MiB", "compactcache's byte budget")
		rounds   = flag.Int("rounds", 1, "rounds of baseline and flush, each after a fill")
		binary   = flag.String("binary", "", "a built cmd/coredns to run instead of building one")
		keep     = flag.Bool("keep", false, "keep the work directory (Corefile, server log)")
		cpu      = flag.Int("cpu", -1, "pin the server to this CPU (taskset; -1: not pinned); pin this tool to another: taskset -c N go run ...")
		nice     = flag.Int("nice", 0, "the server's niceness (nice -n; below 0 as root), for a machine shared with other work")
	)
	flag.Usage = func() { cmd.Usage(flag.CommandLine) }
	flag.Parse()
	if err := run(*names, *hot, *rate, *duration, *capacity, *rounds, *binary, *keep, *cpu, *nice); err != nil {
		cmd.Fatal(err)
	}
}

func run(names, hot, rate int, duration time.Duration, capacity string, rounds int, binary string, keep bool, cpu, nice int) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "adminflush")
	if err != nil {
		return err
	}
	if keep {
		cmd.Progress("work directory: %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	bin := binary
	if bin == "" {
		bin = filepath.Join(work, "coredns")
		cmd.Progress("building cmd/coredns")
		if err := harness.BuildCoreDNS(ctx, "", bin); err != nil {
			return err
		}
	}

	up, err := startUpstream()
	if err != nil {
		return err
	}
	defer up.Shutdown()
	dnsPort, err := harness.FreePort()
	if err != nil {
		return err
	}
	adminPort, err := harness.FreePort()
	if err != nil {
		return err
	}
	dnsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(dnsPort))
	adminAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(adminPort))
	corefile := fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    compactcache {
        capacity %s
        admin %s {
            insecure_loopback
        }
    }
    forward . %s
}
`, dnsPort, capacity, adminAddr, up.Addr())
	server, err := harness.Launch{CPU: cpu, Nice: nice}.CoreDNS(bin, filepath.Join(work, "coredns"), corefile)
	if err != nil {
		return err
	}
	defer server.Stop(5 * time.Second)
	if _, err := harness.WaitDNS(ctx, server, dnsAddr, dns.Question{Name: "h0.hot.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, 30*time.Second, 200*time.Millisecond); err != nil {
		return err
	}

	fmt.Printf("adminflush: %d entries under flush.example, %d hot names, %d q/s of hits, %s a phase, capacity %s\n", names, hot, rate, duration, capacity)
	queries := hotQueries(hot)
	var ratios []float64
	for r := 1; r <= rounds; r++ {
		cmd.Progress("round %d: filling %d + %d entries", r, names, hot)
		start := time.Now()
		if err := fill(dnsAddr, "f%d.flush.example.", names); err != nil {
			return err
		}
		if err := fill(dnsAddr, "h%d.hot.example.", hot); err != nil {
			return err
		}
		entries, err := successEntries(adminAddr)
		if err != nil {
			return err
		}
		cmd.Progress("round %d: %d entries stored in %s", r, entries, time.Since(start).Round(time.Second))
		if entries < int64(names+hot) {
			return fmt.Errorf("%d entries stored of %d: raise -capacity", entries, names+hot)
		}
		if _, err := harness.OpenLoop(dnsAddr, rate, 3*time.Second, queries, nil); err != nil { // warm-up
			return err
		}

		base, err := harness.OpenLoop(dnsAddr, rate, duration, queries, nil)
		if err != nil {
			return err
		}
		fmt.Printf("round %d baseline:     %s\n", r, base.All())

		var f flushRun
		during, err := harness.OpenLoop(dnsAddr, rate, duration, queries, func(done func()) {
			time.Sleep(2 * time.Second)
			f = flushZone(adminAddr, "flush.example.")
			done()
		})
		if err != nil {
			return err
		}
		if f.err != nil {
			return f.err
		}
		window := during.Between(f.start, f.end)
		typical := base.TypicalP99(f.end.Sub(f.start))
		fmt.Printf("round %d flush_zone:   removed %d entries in %.2f s\n", r, f.removed, f.end.Sub(f.start).Seconds())
		fmt.Printf("round %d during flush: %s\n", r, window)
		fmt.Printf("round %d whole phase:  %s\n", r, during.All())
		ratio := float64(window.Percentile(0.99)) / float64(base.All().Percentile(0.99))
		ratios = append(ratios, ratio)
		fmt.Printf("round %d p99 during the flush %d µs / baseline p99 %d µs: %.2f (/ the median p99 of the baseline's stretches as long as the flush, %d µs: %.2f)\n",
			r, window.Percentile(0.99).Microseconds(), base.All().Percentile(0.99).Microseconds(), ratio, typical.Microseconds(), float64(window.Percentile(0.99))/float64(typical))
	}
	if rounds > 1 {
		fmt.Printf("median p99 ratio over %d rounds: %.2f\n", rounds, harness.Median(ratios, func(r float64) float64 { return r }))
	}
	return nil
}

// startUpstream serves every A question with one record, TTL a day, on a
// port of 127.0.0.1.
func startUpstream() (*harness.Server, error) {
	return harness.Serve(dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 86400}, A: net.IPv4(192, 0, 2, 1)}}
		}
		w.WriteMsg(m)
	}))
}

// fill asks format's names 0 to n-1 once each, from several sockets at once,
// again where an answer is lost.
func fill(addr, format string, n int) error {
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
			conn, err := c.Dial(addr)
			if err != nil {
				failed.Add(1)
				return
			}
			defer conn.Close()
			m := new(dns.Msg)
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				m.SetQuestion(fmt.Sprintf(format, i), dns.TypeA)
				ok := false
				for try := 0; try < 3 && !ok; try++ {
					r, _, err := c.ExchangeWithConn(m, conn)
					ok = err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1
				}
				if !ok {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("fill %s: %d names unanswered", format, f)
	}
	return nil
}

// successEntries asks the admin endpoint how many success entries the
// server holds.
func successEntries(addr string) (int64, error) {
	resp, err := http.Get("http://" + addr + admin.Prefix + admin.OpStats)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st admin.StatsReply
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Blocks) != 1 {
		return 0, fmt.Errorf("stats: %v %+v", err, st)
	}
	return st.Blocks[0].Entries.Success, nil
}

// flushRun is a flush and when it ran.
type flushRun struct {
	start, end time.Time
	removed    int64
	err        error
}

func flushZone(addr, zone string) flushRun {
	f := flushRun{start: time.Now()}
	resp, err := http.Post("http://"+addr+admin.Prefix+admin.OpFlushZone+"?zone="+zone, "", nil)
	f.end = time.Now()
	if err != nil {
		f.err = err
		return f
	}
	defer resp.Body.Close()
	var r admin.FlushReply
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || len(r.Blocks) != 1 {
		f.err = fmt.Errorf("flush_zone: %s %v", resp.Status, err)
		return f
	}
	f.removed = r.Blocks[0].Removed.Total()
	return f
}

// hotQueries returns the queries for the names of hot.example, in turn.
func hotQueries(hot int) func(k int, buf []byte) []byte {
	queries := make([][]byte, hot)
	for i := range queries {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("h%d.hot.example.", i), dns.TypeA)
		queries[i], _ = m.Pack()
	}
	return func(k int, buf []byte) []byte { return append(buf, queries[k%hot]...) }
}
