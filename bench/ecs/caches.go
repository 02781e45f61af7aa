package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
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

// newCompact returns compactcache set up from Corefile text by its registered
// setup function, as bench.NewCompact does, with an ecs block when
// maxVariants is not 0 (bench.NewCompact writes no ecs block, so the default
// of 100 variants per name holds). Hits go out through w.Write.
func newCompact(capacityMiB, maxVariants int, next plugin.Handler) (*bench.Cache, error) {
	corefile := fmt.Sprintf("compactcache {\n capacity %dMiB\n}", capacityMiB)
	if maxVariants != 0 {
		corefile = fmt.Sprintf("compactcache {\n capacity %dMiB\n ecs {\n  max_variants %d\n }\n}", capacityMiB, maxVariants)
	}
	setup, err := caddy.DirectiveAction("dns", string(bench.Compact))
	if err != nil {
		return nil, err
	}
	ctrl := caddy.NewTestController("dns", corefile)
	ctrl.ServerBlockKeys = []string{"."}
	if err := setup(ctrl); err != nil {
		return nil, fmt.Errorf("compactcache: %v", err)
	}
	cfg := dnsserver.GetConfig(ctrl)
	if len(cfg.Plugin) != 1 {
		return nil, fmt.Errorf("compactcache: setup added %d plugins, want 1", len(cfg.Plugin))
	}
	cc, ok := cfg.Plugin[0](next).(*compactcache.Cache)
	if !ok {
		return nil, fmt.Errorf("compactcache: setup made a %T", cfg.Plugin[0](next))
	}
	cc.SetRawWrites(true)
	return &bench.Cache{Handler: cc, Kind: bench.Compact, Compact: cc}, nil
}

// client sends queries for entry i from a chosen subnet, reusing one request
// and one writer as bench.Driver does (which always asks from
// workload.Client(i)).
type client struct {
	v     workload.Variant
	names *workload.Names
	req   *dns.Msg
	w     *bench.Writer
}

func newClient(v workload.Variant, names *workload.Names) *client {
	return &client{v: v, names: names, req: workload.NewRequest(0, v), w: bench.NewWriter()}
}

func (c *client) set(i int, p netip.Prefix) {
	var name string
	if c.names != nil && i < c.names.Len() {
		name = c.names.Name(i)
	} else {
		name = workload.Name(i)
	}
	workload.SetRequest(c.req, i, c.v, name)
	if c.v&workload.ECS != 0 {
		setPrefix(c.req, p)
	}
}

// query sends entry i's query from subnet p with i in the context, so that a
// miss reaches the upstream.
func (c *client) query(h plugin.Handler, i int, p netip.Prefix) error {
	c.set(i, p)
	_, err := h.ServeDNS(bench.WithIndex(context.Background(), i), c.w, c.req)
	return err
}

// hit sends the query without the index: a miss fails at the upstream.
func (c *client) hit(h plugin.Handler, i int, p netip.Prefix) error {
	c.set(i, p)
	_, err := h.ServeDNS(context.Background(), c.w, c.req)
	return err
}

// tag returns the subnet tag of the last reply, or -1.
func (c *client) tag() (int, error) {
	m, err := c.w.Reply()
	if err != nil {
		return -1, err
	}
	return replyTag(m, c.req.Question[0].Qtype), nil
}

// variantSubnet is the t-th client subnet that asks for entry i: client
// Client(i) + 2t, so that a name's variants are of one family (the family of
// Client(i): IPv4 for even i mod 1000, IPv6 for odd) and distinct for t < 500.
func variantSubnet(i, t int) (int, netip.Prefix) {
	j := (workload.Client(i) + 2*t) % workload.Clients
	return j, workload.Subnet(j)
}

// cost is what one operation of a loop took on average: wall time, the
// CPU time of the thread that ran the loop, and allocations.
type cost struct{ ns, cpuNs, allocs float64 }

// loop runs f over [0, ops) on one locked OS thread. The thread's CPU time
// leaves out the time other processes of a shared machine held the CPU,
// which wall time counts; it also leaves out GC work on other threads, so it
// is only read for loops that do not allocate.
func loop(ops int, f func(i int) error) (cost, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	cpu := threadCPU()
	start := time.Now()
	for i := range ops {
		if err := f(i); err != nil {
			return cost{}, err
		}
	}
	elapsed := time.Since(start)
	cpu = threadCPU() - cpu
	runtime.ReadMemStats(&b)
	n := float64(ops)
	return cost{ns: float64(elapsed.Nanoseconds()) / n, cpuNs: float64(cpu.Nanoseconds()) / n, allocs: float64(b.Mallocs-a.Mallocs) / n}, nil
}

// processCPU returns the CPU time the process has used, every thread's.
func processCPU() time.Duration { return rusage(syscall.RUSAGE_SELF) }

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }
