package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness/figure"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// series is one line of a panel.
type series struct {
	label  string
	color  color.Color
	marker draw.GlyphDrawer // nil: none
	dashed bool
	values bool // label each point with its value
	pts    plotter.XYs
}

// writePNG draws rows into a PNG file at path: a title, three panels side
// by side (bytes per entry, hit ns and the insert's own ns against N, N on a
// log scale), and notes on the method below.
func writePNG(path string, rows []row) error {
	if len(rows) == 0 {
		return fmt.Errorf("no figures to plot")
	}
	pick := func(kind bench.Kind, f func(row) float64) plotter.XYs {
		var pts plotter.XYs
		for _, r := range rows {
			if r.Cache == kind && !slices.ContainsFunc(pts, func(p plotter.XY) bool { return p.X == float64(r.N) }) {
				pts = append(pts, plotter.XY{X: float64(r.N), Y: f(r)})
			}
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return int(a.X - b.X) })
		return pts
	}
	allocs := func(kind bench.Kind, f func(row) float64, what string) string {
		hi := 0.0
		for _, p := range pick(kind, f) {
			hi = max(hi, p.Y)
		}
		if hi < 0.05 {
			return "0 allocs/" + what
		}
		return fmt.Sprintf("<= %.1f allocs/%s", hi, what)
	}
	hitPath := "WriteMsg"
	for _, r := range rows {
		if r.Raw {
			hitPath = "raw bytes"
		}
	}
	payloadPts := pick(bench.Compact, func(r row) float64 { return r.Payload })
	if len(payloadPts) == 0 { // no compactcache rows: payload from the stock cache's
		payloadPts = pick(bench.Stock, func(r row) float64 { return r.Payload })
	}
	hitAllocs := func(r row) float64 { return r.HitAllocs }
	insertAllocs := func(r row) float64 { return r.InsertAlloc }
	var panels []figure.Panel
	for _, p := range []struct {
		title, ylabel string
		ss            []series
	}{
		{"Bytes per entry stored", "bytes per entry (HeapInuse after GC + mapped)", []series{
			{label: "stock cache", color: figure.Red, marker: figure.Diamond{}, values: true, pts: pick(bench.Stock, func(r row) float64 { return r.HeapInuse })},
			{label: "compactcache", color: figure.Blue, marker: draw.CircleGlyph{}, values: true, pts: pick(bench.Compact, func(r row) float64 { return r.HeapInuse })},
			{label: "payload (the information held)", color: figure.Gray, dashed: true, pts: payloadPts},
		}},
		{"Hit through ServeDNS, keys uniform over N", "ns per hit, reply packed", []series{
			{label: "stock cache, WriteMsg: " + allocs(bench.Stock, hitAllocs, "hit"), color: figure.Red, marker: figure.Diamond{}, values: true,
				pts: pick(bench.Stock, func(r row) float64 { return r.HitNs })},
			{label: "compactcache, " + hitPath + ": " + allocs(bench.Compact, hitAllocs, "hit"), color: figure.Blue, marker: draw.CircleGlyph{}, values: true,
				pts: pick(bench.Compact, func(r row) float64 { return r.HitNs })},
			{label: "two dependent random reads over compactcache's bytes (the machine's; a hit makes two)", color: figure.Blue, dashed: true,
				pts: slices.DeleteFunc(pick(bench.Compact, func(r row) float64 { return 2 * r.ReadNs }), func(p plotter.XY) bool { return p.Y == 0 })},
		}},
		{"Insert: the cache's own share of a miss", "ns per insert, median of the blocks", []series{
			{label: "stock cache: " + allocs(bench.Stock, insertAllocs, "insert"), color: figure.Red, marker: figure.Diamond{}, values: true,
				pts: pick(bench.Stock, func(r row) float64 { return r.InsertNs })},
			{label: "compactcache: " + allocs(bench.Compact, insertAllocs, "insert"), color: figure.Blue, marker: draw.CircleGlyph{}, values: true,
				pts: pick(bench.Compact, func(r row) float64 { return r.InsertNs })},
		}},
	} {
		pn, err := panel(p.title, p.ylabel, p.ss)
		if err != nil {
			return err
		}
		panels = append(panels, pn)
	}
	f := &figure.Figure{
		Width: 21 * vg.Inch, Height: 9 * vg.Inch,
		Title:      "compactcache and the stock CoreDNS cache against the number of entries stored (N)",
		Cols:       3,
		Panels:     panels,
		LegendSide: figure.Below,
		LegendSize: 1.1 * vg.Inch,
		Notes: []string{
			"go run ./bench/report -n N1,N2,...: each N in a child process of its own, all N entries verified stored (every key queried, each hit with its own payload).",
			"Bytes: HeapInuse after runtime.GC() with the N entries stored, minus before, over N, compactcache's store mapped outside the Go heap counted in.",
			"Hits: keys uniform over N, the queries' names built untimed in batches; WriteMsg: the writer packs the reply as the server does; raw: w.Write of the reply bytes.",
			"Inserts: N misses through ServeDNS less the upstream alone, timed in alternating blocks of 10,000 queries; the median of the blocks' differences.",
		},
	}
	return f.Save(path)
}

// panel plots series against N on a log scale, ticked at the Ns measured,
// y from 0 to a round figure above the largest value.
func panel(title, ylabel string, ss []series) (figure.Panel, error) {
	p := figure.NewPlot(title, "entries stored, N (log scale)", ylabel)
	l := figure.NewLegend()
	lo, hi, top := math.Inf(1), math.Inf(-1), 0.0
	var ticks []plot.Tick
	for _, s := range ss {
		for _, pt := range s.pts {
			lo, hi, top = min(lo, pt.X), max(hi, pt.X), max(top, pt.Y)
			if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == pt.X }) {
				ticks = append(ticks, plot.Tick{Value: pt.X, Label: formatN(pt.X)})
			}
		}
	}
	if len(ticks) == 0 {
		return figure.Panel{}, fmt.Errorf("%s: no figures to plot", title)
	}
	for _, s := range ss {
		if len(s.pts) == 0 {
			continue
		}
		line, err := figure.NewLine(s.pts, s.color, s.marker, vg.Points(5), s.dashed)
		if err != nil {
			return figure.Panel{}, err
		}
		line.AddTo(p, &l, s.label)
		if s.values {
			v, err := figure.Values(s.pts, func(v float64) string { return fmt.Sprintf("%.0f", v) }, s.color, false)
			if err != nil {
				return figure.Panel{}, err
			}
			p.Add(v)
		}
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = lo/math.Pow(10, 0.2), hi*math.Pow(10, 0.2)
	p.Y.Min, p.Y.Max = 0, figure.RoundTop(top*1.1)
	return figure.Panel{Plot: p, Legend: l}, nil
}

// formatN writes 30000 as 30k and 3000000 as 3M.
func formatN(n float64) string {
	switch v := int64(n); {
	case v >= 1e6 && v%1e6 == 0:
		return fmt.Sprintf("%dM", v/1e6)
	case v >= 1e6 && v%1e5 == 0:
		return fmt.Sprintf("%.1fM", n/1e6)
	case v >= 1e3 && v%1e3 == 0:
		return fmt.Sprintf("%dk", v/1e3)
	default:
		return fmt.Sprintf("%d", v)
	}
}
