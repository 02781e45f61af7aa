//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/compactcache/compactcache/bench/harness"
)

// report is a run's results, printed as Markdown tables.
type report struct {
	Options  map[string]string
	Machine  map[string]string
	Started  string
	Finished string
	Results  []result
	Profiles []profileResult
}

func (rep *report) n() int {
	n, _ := strconv.Atoi(rep.Options["n"])
	return n
}

func (rep *report) rates() []int {
	var rs []int
	for _, f := range strings.Split(rep.Options["rates"], ",") {
		if r, err := strconv.Atoi(f); err == nil {
			rs = append(rs, r)
		}
	}
	return rs
}

// group is the successful results of one config, one per round.
type group struct {
	spec string
	kind string
	rs   []*result
}

// med returns the median over the rounds of a figure, leaving out the
// rounds where it is missing (0).
func (g *group) med(f func(*result) float64) float64 {
	if g == nil {
		return 0
	}
	var vs []float64
	for _, r := range g.rs {
		if v := f(r); v != 0 && !math.IsNaN(v) {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// groups returns the configs in the order they ran, with their successful
// rounds.
func (rep *report) groups() []*group {
	var gs []*group
	idx := map[string]*group{}
	for i := range rep.Results {
		res := &rep.Results[i]
		g := idx[res.Config.Spec]
		if g == nil {
			g = &group{spec: res.Config.Spec, kind: res.Config.Kind}
			idx[g.spec] = g
			gs = append(gs, g)
		}
		if res.Err == "" && res.Max != nil {
			g.rs = append(g.rs, res)
		}
	}
	return gs
}

// ifGo returns s for a CoreDNS server, a dash for a figure that only a Go
// server has (heap, GC).
func (g *group) ifGo(s string) string {
	if goServer(g.kind) {
		return s
	}
	return "–"
}

func (rep *report) find(spec string) *group {
	for _, g := range rep.groups() {
		if g.spec == spec && len(g.rs) > 0 {
			return g
		}
	}
	return nil
}

// Figures of a result, 0 where it has none.
func figFill(f func(*phase) float64) func(*result) float64 {
	return func(r *result) float64 {
		if len(r.Fills) == 0 {
			return 0
		}
		return f(&r.Fills[0])
	}
}

func figMax(f func(*phase) float64) func(*result) float64 {
	return func(r *result) float64 { return f(r.Max) }
}

func figRate(q int, f func(*phase) float64) func(*result) float64 {
	return func(r *result) float64 {
		if ph := r.rate(q); ph != nil {
			return f(ph)
		}
		return 0
	}
}

func cpuQ(p *phase) float64 { return p.cpuPerQuery() }
func gcQ(p *phase) float64  { return p.gcPerQuery() }
func gcs(p *phase) float64 {
	if p.GC.Cycles == 0 {
		return math.SmallestNonzeroFloat64 // present, and none
	}
	return float64(p.GC.Cycles)
}
func qps(p *phase) float64  { return p.Perf.QPS }
func hits(p *phase) float64 { return p.hitRatio() }
func other(p *phase) float64 {
	if v := p.foreign(); v > 0 {
		return v
	}
	return math.SmallestNonzeroFloat64 // present, and none
}
func lat(f func(*harness.Latency) float64) func(*phase) float64 {
	return func(p *phase) float64 {
		if p.Perf.Lat == nil || p.Perf.Lat.N == 0 {
			return 0
		}
		return f(p.Perf.Lat)
	}
}

// gcOff reports whether a config turns GOGC off: its heap grows to
// GOMEMLIMIT whatever it holds, and so does its RSS.
func gcOff(spec string) bool { return strings.Contains(spec, "GOGC=off") }

// table accumulates a Markdown table.
type table struct {
	head []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.head, " | "))
	seps := make([]string, len(t.head))
	for i := range seps {
		seps[i] = "---"
		if i > 0 {
			seps[i] = "--:"
		}
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

// fixed returns a formatter of v with prec decimals, a dash for NaN and
// the infinities.
func fixed(prec int) func(float64) string {
	return func(v float64) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "–"
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
}

var f0, f1, f2 = fixed(0), fixed(1), fixed(2)

// orDash formats v, or a dash where the figure is missing (0).
func orDash(f func(float64) string, v float64) string {
	if v == 0 {
		return "–"
	}
	return f(v)
}

func pct(v float64) string { return f1(100*v) + "%" }

func ratio(a, b float64) string {
	if b == 0 || a == 0 {
		return "–"
	}
	if r := a / b; r < 0.1 {
		return strconv.FormatFloat(r, 'g', 2, 64)
	}
	return f2(a / b)
}

func (rep *report) write(w io.Writer) error {
	n := rep.n()
	fmt.Fprintf(w, "## End-to-end run (%s)\n\n", rep.Started)
	for _, k := range []string{"cpu", "nproc", "memory", "kernel", "go", "dnsperf", "source"} {
		if v := rep.Machine[k]; v != "" {
			fmt.Fprintf(w, "- %s: %s\n", k, v)
		}
	}
	for _, res := range rep.Results {
		if v := rep.Machine[revSource(res.Config.Rev)]; res.Config.Rev != "" && v != "" && res.Round == 1 {
			fmt.Fprintf(w, "- %s: %s\n", res.Config.Spec, v)
		}
	}
	for _, k := range []string{"coredns", "unbound"} {
		if v := rep.Machine[k]; v != "" {
			fmt.Fprintf(w, "- %s: %s\n", k, strings.ReplaceAll(v, "\n", " "))
		}
	}
	fmt.Fprintf(w, "- command: `%s`\n", rep.Options["command"])
	fmt.Fprintf(w, "- N = %d entries; each phase %s; server on CPU %s, dnsperf and the upstream on CPU %s at niceness %s; dnsperf -c %s, -q %s at max\n",
		n, rep.Options["duration"], rep.Options["server-core"], rep.Options["client-core"], rep.Options["nice"], rep.Options["clients"], rep.Options["outstanding"])
	if rep.Options["rt-rates"] == "true" {
		fmt.Fprintf(w, "- fixed-rate phases: server and dnsperf under SCHED_RR %d\n", rtPriority)
	}
	if rep.Options["rt-max"] == "true" {
		fmt.Fprintf(w, "- max-throughput phases: server and dnsperf under SCHED_RR %d\n", rtPriority)
	}
	fmt.Fprintln(w)

	for _, res := range rep.Results {
		if res.Err != "" {
			fmt.Fprintf(w, "- **%s failed**: %s\n", res.Config.Spec, res.Err)
		}
	}

	rounds := ""
	if r := rep.Options["rounds"]; r != "" && r != "1" {
		rounds = fmt.Sprintf(" (median of %s rounds)", r)
	}
	gs := rep.groups()
	fmt.Fprintf(w, "### Memory and hit throughput%s\n\n", rounds)
	t := table{head: []string{"config", "RSS before fill MiB", "after fill MiB", "RSS B/entry", "after hits", "heap B/entry", "store B/entry", "fill q/s", "server µs/miss", "max hit q/s", "server µs/q", "q/s per server core", "dnsperf CPU", "other load on server core", "hits", "GCs", "GC µs/q"}}
	for _, g := range gs {
		if len(g.rs) == 0 {
			continue
		}
		row := []string{g.spec, "–", "–", "–", "–", "–", "–", "–", "–"}
		if cached(g.kind) {
			rssPer := f0(g.med(func(r *result) float64 { return r.rssPerEntry(n) }))
			rssEnd := f0(g.med(func(r *result) float64 { return r.rssEndPerEntry(n) }))
			if gcOff(g.spec) {
				rssPer, rssEnd = "(at the limit)", "–"
			}
			row = []string{g.spec,
				f1(mib(int64(g.med(func(r *result) float64 { return float64(r.RSSStart) })))),
				f1(mib(int64(g.med(func(r *result) float64 { return float64(r.RSSFill) })))),
				rssPer, rssEnd,
				g.ifGo(f0(g.med(func(r *result) float64 { return r.heapPerEntry(n) }))),
				orDash(f0, g.med(func(r *result) float64 { return r.storePerEntry() })),
				f0(g.med(figFill(qps))), f1(g.med(figFill(cpuQ)))}
		}
		h := "–"
		if cached(g.kind) {
			h = pct(g.med(figMax(hits)))
		}
		us := g.med(figMax(cpuQ))
		row = append(row, f0(g.med(figMax(qps))), f2(us), f0(1e6/us),
			pct(g.med(figMax(func(p *phase) float64 { return p.Perf.ClientCPU.Seconds() / p.Perf.Seconds }))),
			pct(g.med(figMax(other))), h, g.ifGo(f0(g.med(figMax(gcs)))), g.ifGo(f2(g.med(figMax(gcQ)))))
		t.add(row...)
	}
	t.write(w)

	fmt.Fprintf(w, "### Latency at fixed rates%s\n\n", rounds)
	t = table{head: []string{"config", "rate q/s", "answered q/s", "lost", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs", "server µs/q", "other load on server core", "hits", "GCs", "GC µs/q"}}
	for _, q := range rep.rates() {
		for _, g := range gs {
			if g.med(figRate(q, lat(func(l *harness.Latency) float64 { return l.P50 }))) == 0 {
				continue
			}
			h := "–"
			if cached(g.kind) {
				h = pct(g.med(figRate(q, hits)))
			}
			l := func(f func(*harness.Latency) float64) string { return f0(g.med(figRate(q, lat(f)))) }
			t.add(g.spec, strconv.Itoa(q), f0(g.med(figRate(q, qps))),
				f0(g.med(figRate(q, func(p *phase) float64 { return float64(p.Perf.Lost) }))),
				l(func(l *harness.Latency) float64 { return l.P50 }), l(func(l *harness.Latency) float64 { return l.P90 }),
				l(func(l *harness.Latency) float64 { return l.P99 }), l(func(l *harness.Latency) float64 { return l.P999 }),
				l(func(l *harness.Latency) float64 { return l.Max }),
				f2(g.med(figRate(q, cpuQ))), pct(g.med(figRate(q, other))), h,
				g.ifGo(f0(g.med(figRate(q, gcs)))), g.ifGo(f2(g.med(figRate(q, gcQ)))))
		}
	}
	t.write(w)

	if len(rep.Results) > len(gs) {
		rep.writeRounds(w)
	}
	rep.writeRatios(w)
	rep.writeUnbound(w)
	rep.writeWhoami(w)

	for _, pr := range rep.Profiles {
		fmt.Fprintf(w, "### CPU profile: %s\n\n", pr.Config.Spec)
		if pr.Err != "" {
			fmt.Fprintf(w, "failed: %s\n\n", pr.Err)
			continue
		}
		fmt.Fprintf(w, "%.0f hit q/s, server %.2f µs/q during the run; profile %s\n\n", pr.Phase.Perf.QPS, pr.Phase.cpuPerQuery(), pr.Profile)
		fmt.Fprintf(w, "```\n%s```\n\n", pr.Top)
		fmt.Fprintf(w, "```\n%s```\n\n", pr.Cum)
	}
	return nil
}

// pairs returns each compactcache config with the stock config that differs
// only in the cache.
func (rep *report) pairs() [][2]*group {
	var ps [][2]*group
	for _, a := range rep.groups() {
		sk, ok := stockOf(a.kind)
		if !ok || len(a.rs) == 0 {
			continue
		}
		spec := sk
		if _, env, found := strings.Cut(a.spec, "@"); found {
			spec += "@" + env
		}
		if b := rep.find(spec); b != nil {
			ps = append(ps, [2]*group{a, b})
		}
	}
	return ps
}

func (rep *report) writeRatios(w io.Writer) {
	ps := rep.pairs()
	if len(ps) == 0 {
		return
	}
	n := rep.n()
	fmt.Fprintln(w, "### compactcache / stock cache")
	fmt.Fprintln(w)
	head := []string{"figure"}
	for _, p := range ps {
		head = append(head, p[0].spec+" / "+p[1].spec)
	}
	t := table{head: head}
	row := func(name string, f func(*result) float64) {
		r := []string{name}
		for _, p := range ps {
			r = append(r, ratio(p[0].med(f), p[1].med(f)))
		}
		t.add(r...)
	}
	row("RSS per entry", func(r *result) float64 { return r.rssPerEntry(n) })
	row("Go heap per entry (after GC)", func(r *result) float64 { return r.heapPerEntry(n) })
	row("server µs per miss (fill)", figFill(cpuQ))
	row("max hit q/s", figMax(qps))
	row("server µs/q at max", figMax(cpuQ))
	for _, q := range rep.rates() {
		row(fmt.Sprintf("p50 at %d/s", q), figRate(q, lat(func(l *harness.Latency) float64 { return l.P50 })))
		row(fmt.Sprintf("p99 at %d/s", q), figRate(q, lat(func(l *harness.Latency) float64 { return l.P99 })))
		row(fmt.Sprintf("server µs/q at %d/s", q), figRate(q, cpuQ))
	}
	t.write(w)
}

func (rep *report) writeWhoami(w io.Writer) {
	who := rep.find(kindWhoami)
	if who == nil {
		return
	}
	kubeWho := rep.find(kindKubeWhoami)
	fmt.Fprintln(w, "### Server CPU per query beside whoami (the server core's floor)")
	fmt.Fprintln(w)
	if kubeWho != nil {
		fmt.Fprintln(w, "\"÷ floor\" divides by the same block's floor: whoami for the minimal Corefiles, kube-whoami (the kube-dns Corefile with whoami in place of forward and the cache) for the kube-dns ones.")
		fmt.Fprintln(w)
	}
	head := []string{"config", "µs/q at max", "÷ whoami"}
	if kubeWho != nil {
		head = append(head, "÷ floor")
	}
	for _, q := range rep.rates() {
		head = append(head, fmt.Sprintf("µs/q at %d/s", q), "÷ whoami")
		if kubeWho != nil {
			head = append(head, "÷ floor")
		}
	}
	t := table{head: head}
	figs := []func(*result) float64{figMax(cpuQ)}
	for _, q := range rep.rates() {
		figs = append(figs, figRate(q, cpuQ))
	}
	for _, g := range rep.groups() {
		if len(g.rs) == 0 {
			continue
		}
		floor := who
		if f := rep.find(floorOf(g.kind)); f != nil {
			floor = f
		}
		r := []string{g.spec}
		for _, f := range figs {
			a := g.med(f)
			r = append(r, f2(a), ratio(a, who.med(f)))
			if kubeWho != nil {
				r = append(r, ratio(a, floor.med(f)))
			}
		}
		t.add(r...)
	}
	t.write(w)
}

// writeRounds lists each round's main figures, to show their spread.
func (rep *report) writeRounds(w io.Writer) {
	n := rep.n()
	fmt.Fprintln(w, "### Each round")
	fmt.Fprintln(w)
	head := []string{"config", "round", "phases begun busy", "RSS B/entry", "heap B/entry", "max q/s", "µs/q at max", "other load"}
	for _, q := range rep.rates() {
		head = append(head, fmt.Sprintf("p99 at %d/s", q), fmt.Sprintf("µs/q at %d/s", q), "other load")
	}
	t := table{head: head}
	for _, g := range rep.groups() {
		for _, r := range g.rs {
			busy := 0
			for _, ph := range append([]phase{*r.Max}, r.Rates...) {
				if !ph.Quiet && ph.Waited > 0 {
					busy++
				}
			}
			row := []string{g.spec, strconv.Itoa(r.Round), strconv.Itoa(busy), "–", "–", f0(r.Max.Perf.QPS), f2(r.Max.cpuPerQuery()), pct(r.Max.foreign())}
			if cached(g.kind) {
				row[3] = f0(r.rssPerEntry(n))
				if gcOff(g.spec) {
					row[3] = "(at the limit)"
				}
				row[4] = g.ifGo(f0(r.heapPerEntry(n)))
			}
			for _, q := range rep.rates() {
				ph := r.rate(q)
				if ph == nil || ph.Perf.Lat == nil {
					row = append(row, "–", "–", "–")
					continue
				}
				row = append(row, f0(ph.Perf.Lat.P99), f2(ph.cpuPerQuery()), pct(ph.foreign()))
			}
			t.add(row...)
		}
	}
	t.write(w)
}

// writeUnbound sets each config's main figures beside Unbound's, with the
// ratio to Unbound's in parentheses.
func (rep *report) writeUnbound(w io.Writer) {
	ub := rep.find(kindUnbound)
	if ub == nil {
		return
	}
	gs := []*group{ub}
	for _, g := range rep.groups() {
		if g.kind != kindUnbound && len(g.rs) > 0 {
			gs = append(gs, g)
		}
	}
	if len(gs) == 1 {
		return
	}
	n := rep.n()
	fmt.Fprintln(w, "### Beside Unbound (÷ Unbound's in parentheses)")
	fmt.Fprintln(w)
	head := []string{"figure"}
	for _, g := range gs {
		head = append(head, g.spec)
	}
	t := table{head: head}
	row := func(name string, format func(float64) string, f func(*result) float64) {
		r := []string{name}
		ref := ub.med(f)
		for _, g := range gs {
			v := g.med(f)
			cell := orDash(format, v)
			if g != ub && v != 0 && ref != 0 {
				cell += " (" + ratio(v, ref) + ")"
			}
			r = append(r, cell)
		}
		t.add(r...)
	}
	row("server µs per hit query at max", f2, figMax(cpuQ))
	row("max hit q/s", f0, figMax(qps))
	for _, q := range rep.rates() {
		row(fmt.Sprintf("server µs/q at %d/s", q), f2, figRate(q, cpuQ))
		row(fmt.Sprintf("p50 µs at %d/s", q), f0, figRate(q, lat(func(l *harness.Latency) float64 { return l.P50 })))
		row(fmt.Sprintf("p99 µs at %d/s", q), f0, figRate(q, lat(func(l *harness.Latency) float64 { return l.P99 })))
	}
	row("RSS B/entry", f0, func(r *result) float64 { return r.rssPerEntry(n) })
	row("server µs per miss (fill)", f1, figFill(cpuQ))
	t.write(w)
}
