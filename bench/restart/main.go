//go:build linux

// Command restart measures what a restart costs a server under load, and
// what compactcache's snapshot and a peer warm-up save of it: the custom
// CoreDNS build (cmd/coredns) runs as a process on 127.0.0.1 under steady
// Zipf load at a fixed rate, and is stopped (SIGTERM) and started again.
//
//	go run ./bench/restart                          # 3 rounds, about 5 minutes each
//	go run ./bench/restart -rounds 1 -warm 20s -after 20s -write 10s   # a quick look
//	go run ./bench/restart -compare /tmp/other-coredns   # and the writes' phase of another build
//
// It builds cmd/coredns (or takes -binary) and runs an upstream in this
// process that answers the reference workload's names (internal/workload)
// and notes when it is asked. A round:
//
//   - starts the server with `snapshot PATH` and asks it -warm of Zipf(-skew)
//     queries over -names names at -rate q/s, open loop; then stops it
//     (SIGTERM), which writes the snapshot;
//   - restarts it three times, each time with the same queries after the
//     restart that the stopped server would have been asked next, for
//     -after: from the snapshot (`snapshot PATH`), cold (no snapshot), and
//     warmed from a peer (`warmup URL`), a second process started from the
//     same snapshot with its admin endpoint open and a token, reached
//     through a relay in this process that renames the block (on one host
//     the peer cannot listen where the restarted server does, and a
//     warm-up asks for its own block's name);
//   - runs the server once more from the snapshot with `snapshot PATH
//     -interval` under the same load for -write, and reads from its log
//     when each write ran; with -compare, another build's too, the order
//     alternating from round to round.
//
// Time zero of a restart is the moment the new process first answers (a
// probe asked every 2 ms). The hit rate of a stretch is the share of the
// queries sent in it that the upstream was not asked for. A round prints
// the hit rate over the first 2 s and 10 s after the restart over that of
// the last 10 s before it; the upstream queries of the first -after over
// those of the cold start; the load, warm-up and write times the server
// logged, per million entries, and the CPU time of the load (what the
// restart from the snapshot had used by its first answer beyond what the
// cold start had, from /proc/PID/task/*/schedstat), which the other work of
// a shared machine does not stretch as it does wall time; and the p99
// latency of the queries sent while a snapshot was being written over that
// of the others of the same phase (writes.go). Over several rounds it
// prints the median of each, and the targets met or not.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
)

const cmd = harness.Command("restart")

// config is the command line.
type config struct {
	names    int
	skew     float64
	rate     int
	warm     time.Duration
	after    time.Duration
	write    time.Duration
	interval time.Duration
	capacity string
	rounds   int
	binary   string
	compare  string
	keep     bool
	cpu      int
	nice     int
}

func main() {
	var cfg config
	flag.IntVar(&cfg.names, "names", 1_000_000, "names of the reference workload the load asks")
	flag.Float64Var(&cfg.skew, "skew", workload.TraceSkew, "Zipf exponent of the names' popularity")
	flag.IntVar(&cfg.rate, "rate", 5_000, "queries per second of the load")
	flag.DurationVar(&cfg.warm, "warm", 60*time.Second, "load before the restart")
	flag.DurationVar(&cfg.after, "after", time.Minute, "load after each restart, over which upstream queries are counted")
	flag.DurationVar(&cfg.write, "write", 30*time.Second, "load of the phase with snapshots written every -interval")
	flag.DurationVar(&cfg.interval, "interval", 2*time.Second, "snapshot INTERVAL of that phase")
	flag.StringVar(&cfg.capacity, "capacity", "16MiB", "compactcache's byte budget")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds, each with its own Zipf stream")
	flag.StringVar(&cfg.binary, "binary", "", "a built cmd/coredns to run instead of building one")
	flag.StringVar(&cfg.compare, "compare", "", "another build of cmd/coredns whose writes' phase runs beside the first's in each round")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the work directory (Corefiles, server logs, snapshots)")
	flag.IntVar(&cfg.cpu, "cpu", -1, "pin the servers to this CPU (taskset; -1: not pinned)")
	flag.IntVar(&cfg.nice, "nice", 0, "the servers' niceness (nice -n; below 0 as root)")
	flag.Usage = func() { cmd.Usage(flag.CommandLine) }
	flag.Parse()
	if err := run(cfg); err != nil {
		cmd.Fatal(err)
	}
}

func run(cfg config) error {
	if cfg.after < 10*time.Second || cfg.warm < 10*time.Second {
		return fmt.Errorf("-warm and -after must be 10s at least: the hit rates are of 10 s stretches")
	}
	work, err := os.MkdirTemp("", "restart")
	if err != nil {
		return err
	}
	if cfg.keep {
		cmd.Progress("work directory: %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	e := &env{bin: cfg.binary, work: work, capacity: cfg.capacity, cpu: cfg.cpu, nice: cfg.nice}
	if e.bin == "" {
		e.bin = filepath.Join(work, "coredns")
		cmd.Progress("building cmd/coredns")
		if err := harness.BuildCoreDNS(context.Background(), "", e.bin); err != nil {
			return err
		}
	}
	for _, p := range []*int{&e.dns, &e.ready, &e.peerDNS, &e.peerAdmin} {
		if *p, err = harness.FreePort(); err != nil {
			return err
		}
	}
	e.token = filepath.Join(work, "token")
	if err := os.WriteFile(e.token, []byte("restart-benchmark-token-0123456789\n"), 0o600); err != nil {
		return err
	}
	names := workload.NewNames(cfg.names)
	if e.upstream, err = startUpstream(names); err != nil {
		return err
	}
	defer e.upstream.Shutdown()

	fmt.Printf("restart: %s; %s\n", harness.CPUModel(), harness.Revision())
	fmt.Printf("restart: Zipf(%g) over %d names of the reference workload, %d q/s, %v before the restart, %v after, capacity %s, %d round(s)\n",
		cfg.skew, cfg.names, cfg.rate, cfg.warm, cfg.after, cfg.capacity, cfg.rounds)
	var rounds []roundResult
	for r := 1; r <= cfg.rounds; r++ {
		res, err := e.round(r, cfg, names)
		if err != nil {
			return fmt.Errorf("round %d: %v", r, err)
		}
		res.print(r)
		rounds = append(rounds, res)
	}
	fmt.Print(summary(rounds))
	return nil
}

// zipfQueries returns the queries of z's stream, one per call.
func zipfQueries(z *workload.Zipf, names *workload.Names) func(k int, buf []byte) []byte {
	m := workload.NewRequest(0, workload.Plain)
	return func(_ int, buf []byte) []byte {
		i := z.Next()
		workload.SetRequest(m, i, workload.Plain, names.Name(i))
		b, err := m.PackBuffer(buf)
		if err != nil {
			cmd.Fatal(err)
		}
		return b
	}
}

// hitRate returns the share of the queries sent from start to end (end
// excluded) that the upstream was not asked for in the same stretch.
func hitRate(p *harness.Phase, up *upstream, start, end time.Time) float64 {
	n := p.Sent(start, end)
	if n == 0 {
		return 0
	}
	return 1 - float64(up.Asked(start, end))/float64(n)
}

// scenario is one restart: how the new process came up and what it cost.
type scenario struct {
	startup  time.Duration // from its start to its first answer
	cpu      time.Duration // the CPU time it had used by then
	hit2     float64       // hit rate of the first 2 s
	hit10    float64       // of the first 10 s
	upstream int           // upstream queries over -after
	sent     int           // queries sent over -after
	fill     timed         // the entries loaded or warmed, as the server logged it
	ready    time.Duration // warm-up: time zero to the ready plugin's first OK
	hit2r    float64       // warm-up: hit rate of the first 2 s after ready
}

// roundResult is what a round measured.
type roundResult struct {
	before                 float64 // hit rate of the last 10 s before the restart
	beforeSent             int
	final                  timed // the write on SIGTERM
	snapshot, cold, warmup scenario
	writes                 writesResult
	compare                *writesResult // -compare's build
}

func (e *env) round(r int, cfg config, names *workload.Names) (roundResult, error) {
	var res roundResult
	snap := filepath.Join(e.work, fmt.Sprintf("round%d.snap", r))
	orig := snap + ".orig"

	cmd.Progress("round %d: %v of load before the restart", r, cfg.warm)
	s0, err := e.start("before", e.serverCorefile(fmt.Sprintf("        snapshot %s\n", snap)))
	if err != nil {
		return res, err
	}
	defer s0.Stop(time.Minute)
	if _, err := firstAnswer(s0, e.dnsAddr(), 30*time.Second); err != nil {
		return res, err
	}
	z := workload.NewZipf(cfg.names, cfg.skew, r)
	warm, err := harness.OpenLoop(e.dnsAddr(), cfg.rate, cfg.warm, zipfQueries(z, names), nil)
	if err != nil {
		return res, err
	}
	last := warm.Samples[len(warm.Samples)-1].Sent.Add(time.Nanosecond)
	res.before = hitRate(warm, e.upstream, last.Add(-10*time.Second), last)
	res.beforeSent = warm.Sent(last.Add(-10*time.Second), last)
	s0.Stop(time.Minute)
	if res.final, err = s0.logged(writtenLine, 0); err != nil {
		return res, err
	}
	if err := copyFile(orig, snap); err != nil {
		return res, err
	}
	post := *z // the stream where the stopped server left it

	// restart starts the server with extra in its block and asks it the
	// queries that follow the stopped server's; fill, if given, is the log
	// line of the entries it loaded.
	restart := func(name, extra string, fill *regexp.Regexp) (scenario, error) {
		cmd.Progress("round %d: %s restart, %v of load", r, name, cfg.after)
		var sc scenario
		s, err := e.start(name, e.serverCorefile(extra))
		if err != nil {
			return sc, err
		}
		defer s.Stop(time.Minute)
		var ready <-chan time.Time
		warmup := fill == warmedLine
		if warmup {
			ready = e.readyAt(cfg.after)
		}
		t0, err := firstAnswer(s, e.dnsAddr(), time.Minute)
		if err != nil {
			return sc, err
		}
		if sc.cpu, err = harness.RunTime(s.Pid()); err != nil {
			return sc, err
		}
		z := post
		p, err := harness.OpenLoop(e.dnsAddr(), cfg.rate, cfg.after, zipfQueries(&z, names), nil)
		if err != nil {
			return sc, err
		}
		sc.startup = t0.Sub(s.started)
		sc.hit2 = hitRate(p, e.upstream, t0, t0.Add(2*time.Second))
		sc.hit10 = hitRate(p, e.upstream, t0, t0.Add(10*time.Second))
		sc.upstream = e.upstream.Asked(t0, t0.Add(cfg.after))
		sc.sent = p.Sent(t0, t0.Add(cfg.after))
		if warmup {
			rt := <-ready
			if rt.IsZero() {
				return sc, fmt.Errorf("%s: the ready plugin did not say ready within %v", name, cfg.after)
			}
			sc.ready = rt.Sub(t0)
			sc.hit2r = hitRate(p, e.upstream, rt, rt.Add(2*time.Second))
		}
		if fill != nil {
			sc.fill, err = s.logged(fill, 0)
		}
		return sc, err
	}

	// file copies the snapshot for a server of the round to read.
	file := func(name string) (string, error) {
		path := filepath.Join(e.work, fmt.Sprintf("round%d-%s.snap", r, name))
		return path, copyFile(path, orig)
	}
	path, err := file("snapshot")
	if err != nil {
		return res, err
	}
	if res.snapshot, err = restart("snapshot", fmt.Sprintf("        snapshot %s\n", path), loadedLine); err != nil {
		return res, err
	}
	if res.cold, err = restart("cold", "", nil); err != nil {
		return res, err
	}

	if path, err = file("peer"); err != nil {
		return res, err
	}
	peer, err := e.start("peer", e.peerCorefile(path))
	if err != nil {
		return res, err
	}
	defer peer.Stop(time.Minute)
	if _, err := peer.logged(loadedLine, time.Minute); err != nil {
		return res, err
	}
	relay, stopRelay, err := e.relay()
	if err != nil {
		return res, err
	}
	defer stopRelay()
	res.warmup, err = restart("warmup", fmt.Sprintf("        warmup http://%s {\n            token_file %s\n            timeout 30s\n        }\n", relay, e.token), warmedLine)
	if err != nil {
		return res, err
	}
	peer.Stop(time.Minute)

	builds := []string{e.bin}
	if cfg.compare != "" {
		builds = append(builds, cfg.compare)
		if r%2 == 0 {
			slices.Reverse(builds) // neither always first
		}
	}
	for _, bin := range builds {
		cmd.Progress("round %d: %v of load with a snapshot written every %v (%s)", r, cfg.write, cfg.interval, bin)
		if path, err = file("writes"); err != nil {
			return res, err
		}
		w, err := e.writesPhase(bin, path, cfg, post, names)
		if err != nil {
			return res, err
		}
		if bin == e.bin {
			res.writes = w
		} else {
			res.compare = &w
		}
	}
	return res, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// print gives the round's figures.
func (res roundResult) print(r int) {
	fmt.Printf("round %d load average of the machine at its end: %s\n", r, harness.LoadAverage())
	fmt.Printf("round %d before:   hit rate %.3f over the last 10 s (%d queries); written on SIGTERM: %d entries in %v (%.2f s per 1M)\n",
		r, res.before, res.beforeSent, res.final.entries, res.final.took, res.final.perMillion().Seconds())
	line := func(name string, sc scenario, extra string) {
		fmt.Printf("round %d %-9s first answer %4d ms after start; hit rate 0-2 s %.3f (%.2f), 0-10 s %.3f (%.2f); upstream %d of %d queries (%.2f of cold)%s\n",
			r, name+":", sc.startup.Milliseconds(), sc.hit2, ratio(sc.hit2, res.before), sc.hit10, ratio(sc.hit10, res.before),
			sc.upstream, sc.sent, ratio(float64(sc.upstream), float64(res.cold.upstream)), extra)
	}
	line("snapshot", res.snapshot, fmt.Sprintf("; loaded %d entries in %v (%.2f s per 1M), CPU to the first answer %v, the cold start's %v (%.2f s per 1M)",
		res.snapshot.fill.entries, res.snapshot.fill.took, res.snapshot.fill.perMillion().Seconds(),
		res.snapshot.cpu.Round(time.Millisecond), res.cold.cpu.Round(time.Millisecond), res.loadCPU().perMillion().Seconds()))
	line("cold", res.cold, "")
	line("warmup", res.warmup, fmt.Sprintf("; %d entries in %v (%.2f s per 1M); ready %d ms after time zero, hit rate of the 2 s after %.3f (%.2f)",
		res.warmup.fill.entries, res.warmup.fill.took, res.warmup.fill.perMillion().Seconds(),
		res.warmup.ready.Milliseconds(), res.warmup.hit2r, ratio(res.warmup.hit2r, res.before)))
	res.writes.print(r, "writes:  ")
	if res.compare != nil {
		res.compare.print(r, "compare: ")
	}
}

// loadCPU is the CPU time the snapshot's load took: what the restart from
// it had used by its first answer beyond what the cold start had.
func (res roundResult) loadCPU() timed {
	return timed{entries: res.snapshot.fill.entries, took: res.snapshot.cpu - res.cold.cpu}
}

// summary is the table of the rounds' medians and the targets.
func summary(rounds []roundResult) string {
	var b strings.Builder
	row := func(figure string, f func(roundResult) float64, format string) float64 {
		m := harness.Median(rounds, f)
		var each []string
		for _, r := range rounds {
			each = append(each, fmt.Sprintf(format, f(r)))
		}
		fmt.Fprintf(&b, "| %s | "+format+" | %s |\n", figure, m, strings.Join(each, ", "))
		return m
	}
	fmt.Fprintf(&b, "\nmedian of %d round(s):\n\n| figure | median | rounds |\n|---|--:|---|\n", len(rounds))
	hit2 := row("snapshot: hit rate 0-2 s ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.snapshot.hit2, r.before) }, "%.2f")
	row("snapshot: hit rate 0-10 s ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.snapshot.hit10, r.before) }, "%.2f")
	row("snapshot: upstream queries, first minute ÷ cold start's", func(r roundResult) float64 { return ratio(float64(r.snapshot.upstream), float64(r.cold.upstream)) }, "%.2f")
	warm2 := row("peer warm-up: hit rate 0-2 s ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.warmup.hit2, r.before) }, "%.2f")
	row("peer warm-up: hit rate 0-10 s ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.warmup.hit10, r.before) }, "%.2f")
	row("peer warm-up: upstream queries, first minute ÷ cold start's", func(r roundResult) float64 { return ratio(float64(r.warmup.upstream), float64(r.cold.upstream)) }, "%.2f")
	row("peer warm-up: ready after time zero, s", func(r roundResult) float64 { return r.warmup.ready.Seconds() }, "%.2f")
	warm2r := row("peer warm-up: hit rate of the 2 s after ready ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.warmup.hit2r, r.before) }, "%.2f")
	row("cold: hit rate 0-2 s ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.cold.hit2, r.before) }, "%.2f")
	row("cold: hit rate 0-10 s ÷ the 10 s before", func(r roundResult) float64 { return ratio(r.cold.hit10, r.before) }, "%.2f")
	row("hit rate of the 10 s before", func(r roundResult) float64 { return r.before }, "%.3f")
	row("entries in the snapshot", func(r roundResult) float64 { return float64(r.final.entries) }, "%.0f")
	load := row("snapshot load, s per 1M entries", func(r roundResult) float64 { return r.snapshot.fill.perMillion().Seconds() }, "%.2f")
	row("snapshot load, CPU s per 1M entries (to the first answer, less the cold start's)", func(r roundResult) float64 { return r.loadCPU().perMillion().Seconds() }, "%.2f")
	row("peer warm-up fill, s per 1M entries", func(r roundResult) float64 { return r.warmup.fill.perMillion().Seconds() }, "%.2f")
	row("snapshot write on SIGTERM, s per 1M entries", func(r roundResult) float64 { return r.final.perMillion().Seconds() }, "%.2f")
	row("snapshot write every interval, s per 1M entries (median of the round's)", func(r roundResult) float64 {
		return harness.Median(r.writes.writes, func(w timed) float64 { return w.perMillion().Seconds() })
	}, "%.2f")
	pooled := row("p99 of the queries sent during writes ÷ of those outside them", func(r roundResult) float64 { return r.writes.pooledRatio() }, "%.2f")
	p99 := row("median over writes of the p99 during each ÷ median p99 of as long stretches away from writes", func(r roundResult) float64 { return r.writes.typicalRatio() }, "%.2f")
	if rounds[0].compare != nil {
		row("-compare: snapshot write every interval, s per 1M entries", func(r roundResult) float64 {
			return harness.Median(r.compare.writes, func(w timed) float64 { return w.perMillion().Seconds() })
		}, "%.2f")
		row("-compare: p99 of the queries sent during writes ÷ of those outside them", func(r roundResult) float64 { return r.compare.pooledRatio() }, "%.2f")
		row("-compare: median over writes of the p99 during each ÷ median p99 of as long stretches away from writes", func(r roundResult) float64 { return r.compare.typicalRatio() }, "%.2f")
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(&b, "\ntargets: hit rate within 2 s >= 0.95 of before: snapshot %.2f %s, peer warm-up %.2f %s (from ready: %.2f %s)\n",
		hit2, met(hit2 >= 0.95), warm2, met(warm2 >= 0.95), warm2r, met(warm2r >= 0.95))
	fmt.Fprintf(&b, "         load <= 1 s per 1M entries: %.2f s %s\n", load, met(load <= 1))
	fmt.Fprintf(&b, "         p99 during a write <= 2x: %.2f %s (all writes' queries pooled: %.2f %s)\n", p99, met(p99 <= 2), pooled, met(pooled <= 2))
	return b.String()
}
