// Command shared measures the shared tier (the shared option, docs/shared.md)
// with a real redis-server: replicas of one block, each a compactcache
// Cache set up from Corefile text, in front of one DNS server on the
// loopback that answers the reference workload's entries, asked in a
// round robin of Zipf queries. It prints, beside the same replicas without
// the tier:
//
//   - the queries that reach the upstream with the tier and without it;
//
//   - the hit rate of a replica started cold mid-run, over its first two
//     seconds, beside the others' over the same seconds;
//
//   - a local hit's time with the tier configured and without;
//
//   - the latency of a local hit, a tier hit and an upstream answer;
//
//   - the latency and SERVFAILs of queries while redis-server is stopped
//     (SIGSTOP);
//
//   - the bytes an entry takes in Redis (INFO memory over the keys) and in
//     the local store.
//
//     go run ./bench/shared                  # about a minute
//     go run ./bench/shared -names 1000000 -queries 2000000
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/compactcache/compactcache"
	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

var (
	names    = flag.Int("names", 300_000, "distinct names the Zipf queries draw from")
	queries  = flag.Int("queries", 600_000, "queries of each run through the replicas")
	skew     = flag.Float64("s", 0.9, "Zipf exponent")
	replicas = flag.Int("replicas", 3, "replicas sharing the tier")
	timeout  = flag.Duration("timeout", 20*time.Millisecond, "the tier's timeout")
)

func main() {
	flag.Parse()
	dir, err := os.MkdirTemp("", "bench-shared")
	check(err)
	defer os.RemoveAll(dir)
	secret := filepath.Join(dir, "secret")
	check(os.WriteFile(secret, []byte("0123456789abcdef-bench-secret\n"), 0o600))
	redis := startRedis(dir)
	defer redis.kill()
	up := startUpstream(*names)
	fmt.Printf("workload: %d Zipf (s=%.2f) queries over %d names, %d replicas in a round robin; redis-server %s; timeout %v\n\n",
		*queries, *skew, *names, *replicas, redis.addr, *timeout)

	sharedOption := fmt.Sprintf("shared redis://%s {\n secret_file %s\n timeout %v\n }\n", redis.addr, secret, *timeout)
	newReplica := func(shared bool) *replica {
		opt := ""
		if shared {
			opt = sharedOption
		}
		return newReplicaOf("compactcache {\n capacity 256MiB\n"+opt+"}", up)
	}

	// 1. Upstream queries, without and with the tier.
	alone := make([]*replica, *replicas)
	for i := range alone {
		alone[i] = newReplica(false)
	}
	run(alone, 0, *queries, nil)
	withTier := make([]*replica, *replicas)
	for i := range withTier {
		withTier[i] = newReplica(true)
	}
	half := *queries / 2
	run(withTier, 0, half, nil)
	// 2. A replica started cold mid-run, for two seconds.
	cold := newReplica(true)
	all := append(slices.Clone(withTier), cold)
	before := snapshotAll(all)
	done := run(all, half, *queries-half, time.After(2*time.Second))
	after := snapshotAll(all)
	run(withTier, half+done, *queries-half-done, nil)
	upAlone, upShared := sumUpstream(alone), sumUpstream(withTier)+cold.up.Load()
	fmt.Printf("queries that reached the upstream: %d without the tier, %d with it: %.3fx (1/%d is the ideal)\n",
		upAlone, upShared, float64(upShared)/float64(upAlone), *replicas)
	coldRate := hitRate(before[len(all)-1], after[len(all)-1])
	var others [2]int64
	for i := range withTier {
		others[0] += after[i].asked - before[i].asked
		others[1] += after[i].up - before[i].up
	}
	fmt.Printf("a replica started cold mid-run: hit rate %.3f over its first %d queries (2 s), the others %.3f over the same seconds\n\n",
		coldRate, after[len(all)-1].asked-before[len(all)-1].asked, 1-float64(others[1])/float64(others[0]))

	// 3. A local hit, with the tier configured and without.
	hot := workload.NewZipf(*names, *skew, 7)
	var hits []int
	for range 1000 {
		hits = append(hits, hot.Next())
	}
	// Alternating rounds, paired: the machine's load moves between rounds
	// more than the two differ.
	var on, off []time.Duration
	var ratios []float64
	for range 11 {
		a, b := timeHits(withTier[0], hits, 100), timeHits(alone[0], hits, 100)
		on, off = append(on, a), append(off, b)
		ratios = append(ratios, float64(a)/float64(b))
	}
	slices.Sort(ratios)
	per := func(d []time.Duration) float64 { return float64(pct(d, 50)) / float64(100*len(hits)) }
	fmt.Printf("a local hit: %.0f ns with the tier, %.0f ns without (medians of 11 rounds); the median of the rounds' ratios %.3fx\n", per(on), per(off), ratios[len(ratios)/2])

	// 4. Latencies: a local hit, a tier hit, an upstream answer.
	fresh := newReplica(true)
	var local, tierHit, upstream []time.Duration
	for _, i := range hits {
		local = append(local, timeQuery(withTier[0], i))
	}
	for _, i := range dedup(hits) {
		tierHit = append(tierHit, timeQuery(fresh, i))
	}
	for i := *names; i < *names+1000; i++ {
		upstream = append(upstream, timeQuery(alone[0], i))
	}
	fmt.Printf("latency, p50 / p99: local hit %v / %v, tier hit %v / %v, upstream answer %v / %v (a loopback DNS server)\n",
		pct(local, 50), pct(local, 99), pct(tierHit, 50), pct(tierHit, 99), pct(upstream, 50), pct(upstream, 99))
	if n := fresh.up.Load(); n != 0 {
		fmt.Printf("  (the fresh replica asked the upstream %d times for names the tier holds)\n", n)
	}

	// 5. redis-server stopped (SIGSTOP) under load.
	redis.signal(syscall.SIGSTOP)
	var lat []time.Duration
	var servfail int
	deadline := time.Now().Add(3 * time.Second)
	for k := 0; time.Now().Before(deadline); k++ {
		i := hot.Next()
		if k%10 == 0 {
			i = 2**names + k // a name no one has: a miss
		}
		start := time.Now()
		rcode := withTier[k%len(withTier)].query(i)
		lat = append(lat, time.Since(start))
		if rcode == dns.RcodeServerFailure {
			servfail++
		}
	}
	redis.signal(syscall.SIGCONT)
	fmt.Printf("redis-server stopped for 3 s: %d queries (one in ten a miss), p99 %v, max %v, %d SERVFAIL\n\n", len(lat), pct(lat, 99), pct(lat, 100), servfail)

	// 6. Bytes per entry.
	keys, used := redis.memory()
	st := withTier[0].c.Stats()
	fmt.Printf("bytes per entry: %.0f in Redis (used_memory %d over %d keys), %.0f in the local store (%d bytes over %d entries)\n",
		float64(used)/float64(keys), used, keys, float64(st.Bytes)/float64(st.Entries), st.Bytes, st.Entries)
	for _, r := range append(append(alone, withTier...), cold, fresh) {
		r.c.StopShared()
	}
}

// replica is a block of its own in front of the shared upstream.
type replica struct {
	c     *compactcache.Cache
	h     plugin.Handler
	w     *bench.Writer
	asked atomic.Int64
	up    atomic.Int64 // queries it sent upstream
}

// newReplicaOf sets a Cache up from corefile, as CoreDNS does a server
// block's, and starts it.
func newReplicaOf(corefile string, up *upstream) *replica {
	setup, err := caddy.DirectiveAction("dns", "compactcache")
	check(err)
	ctrl := caddy.NewTestController("dns", corefile)
	ctrl.ServerBlockKeys = []string{"."}
	check(setup(ctrl))
	r := &replica{w: bench.NewWriter()}
	r.h = dnsserver.GetConfig(ctrl).Plugin[0](plugin.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, m *dns.Msg) (int, error) {
		r.up.Add(1)
		return up.ServeDNS(ctx, w, m)
	}))
	r.c = r.h.(*compactcache.Cache)
	r.c.StartShared("")
	if strings.Contains(corefile, "shared") {
		time.Sleep(200 * time.Millisecond) // it connects in the background
	}
	return r
}

// query asks entry i and returns the rcode the client got.
func (r *replica) query(i int) int {
	r.asked.Add(1)
	r.w.Pack = false
	req := workload.NewRequest(i, workload.Plain)
	if _, err := r.h.ServeDNS(context.Background(), r.w, req); err != nil {
		return dns.RcodeServerFailure
	}
	m, err := r.w.Reply()
	if err != nil {
		return dns.RcodeServerFailure
	}
	return m.Rcode
}

// run sends queries [from, from+n) of the Zipf sequence to rs in turn,
// until stop fires when given, and returns how many it sent.
func run(rs []*replica, from, n int, stop <-chan time.Time) int {
	z := workload.NewZipf(*names, *skew, 1)
	for range from {
		z.Next()
	}
	for k := range n {
		select {
		case <-stop:
			return k
		default:
		}
		rs[(from+k)%len(rs)].query(z.Next())
	}
	return n
}

type counts struct{ asked, up int64 }

func snapshotAll(rs []*replica) []counts {
	var cs []counts
	for _, r := range rs {
		cs = append(cs, counts{r.asked.Load(), r.up.Load()})
	}
	return cs
}

func hitRate(before, after counts) float64 {
	return 1 - float64(after.up-before.up)/float64(after.asked-before.asked)
}

func sumUpstream(rs []*replica) int64 {
	var n int64
	for _, r := range rs {
		n += r.up.Load()
	}
	return n
}

// timeHits asks each of hits rounds times and returns the time taken.
func timeHits(r *replica, hits []int, rounds int) time.Duration {
	reqs := make([]*dns.Msg, len(hits))
	for j, i := range hits {
		reqs[j] = workload.NewRequest(i, workload.Plain)
		r.h.ServeDNS(context.Background(), r.w, reqs[j]) // cached before timing
	}
	start := time.Now()
	for range rounds {
		for _, req := range reqs {
			r.h.ServeDNS(context.Background(), r.w, req)
		}
	}
	return time.Since(start)
}

func timeQuery(r *replica, i int) time.Duration {
	start := time.Now()
	r.query(i)
	return time.Since(start)
}

func dedup(xs []int) []int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return slices.Compact(s)
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return s[i].Round(time.Microsecond)
}

// upstream is a DNS server on the loopback that answers entry i of the
// reference workload for its name, reached by an exchange per query, as
// forward reaches its upstream.
type upstream struct {
	addr   string
	client *dns.Client
}

func startUpstream(n int) *upstream {
	index := make(map[string]int, n)
	for i := range n {
		index[strings.ToLower(workload.Name(i))] = i
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	check(err)
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		i, ok := index[strings.ToLower(r.Question[0].Name)]
		m := new(dns.Msg)
		if ok {
			m = workload.Reply(i, workload.Plain)
			m.Question[0] = r.Question[0]
		} else {
			m.SetRcode(r, dns.RcodeNameError)
			m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 300}, Ns: "a.", Mbox: "b.", Minttl: 300}}
		}
		m.Id, m.Response = r.Id, true
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	return &upstream{addr: pc.LocalAddr().String(), client: &dns.Client{Net: "udp", UDPSize: 4096}}
}

func (u *upstream) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	resp, _, err := u.client.Exchange(r, u.addr)
	if err != nil {
		return dns.RcodeServerFailure, err
	}
	return resp.Rcode, w.WriteMsg(resp)
}

// redisServer is the redis-server the replicas share.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

func startRedis(dir string) *redisServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	r := &redisServer{addr: "127.0.0.1:" + port}
	r.cmd = exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	check(r.cmd.Start())
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := r.do("PING"); err == nil {
			return r
		}
		if time.Now().After(deadline) {
			fail("redis-server did not start")
		}
	}
}

func (r *redisServer) signal(s syscall.Signal) { r.cmd.Process.Signal(s) }

func (r *redisServer) kill() {
	r.cmd.Process.Signal(syscall.SIGCONT)
	r.cmd.Process.Kill()
	r.cmd.Wait()
}

// do sends one inline command and returns the reply's lines.
func (r *redisServer) do(cmd string) ([]string, error) {
	c, err := net.DialTimeout("tcp", r.addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "%s\r\nQUIT\r\n", cmd)
	var lines []string
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, nil
}

// memory returns the keys Redis holds and the bytes it uses for them: its
// used_memory less what it used empty (used_memory_startup).
func (r *redisServer) memory() (keys, used int64) {
	lines, err := r.do("DBSIZE")
	check(err)
	keys, _ = strconv.ParseInt(strings.TrimPrefix(lines[0], ":"), 10, 64)
	lines, err = r.do("INFO memory")
	check(err)
	var total, startup int64
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			total, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(l, "used_memory_startup:"); ok {
			startup, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return keys, total - startup
}

func check(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "shared:", msg)
	os.Exit(1)
}
