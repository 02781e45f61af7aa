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
	below  bool // the value labels under the points
	pts    plotter.XYs
}

// writePNG draws rows into a PNG file at path: a title, two panels side by
// side (bytes per entry against N, hit ns/op against N, N on a log scale),
// and notes on the method below.
func writePNG(path string, rows []row) error {
	if len(rows) == 0 {
		return fmt.Errorf("no figures to plot")
	}
	pick := func(kind bench.Kind, path string, f func(row) float64) plotter.XYs {
		var pts plotter.XYs
		for _, r := range rows {
			if r.Cache == kind && (path == "" || r.Path == path) &&
				!slices.ContainsFunc(pts, func(p plotter.XY) bool { return p.X == float64(r.N) }) {
				pts = append(pts, plotter.XY{X: float64(r.N), Y: f(r)})
			}
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return int(a.X - b.X) })
		return pts
	}
	allocs := func(kind bench.Kind, path string) string {
		hi := 0.0
		for _, p := range pick(kind, path, func(r row) float64 { return r.HitAllocs }) {
			hi = max(hi, p.Y)
		}
		if hi < 0.005 {
			return "0 allocs/hit"
		}
		return fmt.Sprintf("<= %.1f allocs/hit", hi)
	}
	heap := func(r row) float64 { return r.HeapInuse }
	ns := func(r row) float64 { return r.HitBestNs }
	payload := func(r row) float64 { return r.Payload }

	payloadPts := pick(bench.Compact, "", payload)
	if len(payloadPts) == 0 { // no compactcache rows: payload from the stock cache's
		payloadPts = pick(bench.Stock, "", payload)
	}
	bytesPanel, err := panel("Heap bytes per entry stored", "bytes per entry (HeapInuse after GC)", []series{
		{label: "stock cache", color: figure.Red, marker: figure.Diamond{}, values: true, pts: pick(bench.Stock, "", heap)},
		{label: "compactcache", color: figure.Blue, marker: draw.CircleGlyph{}, values: true, pts: pick(bench.Compact, "", heap)},
		{label: "payload (the information held)", color: figure.Gray, dashed: true, pts: payloadPts},
	})
	if err != nil {
		return err
	}
	hitPanel, err := panel("Hit through ServeDNS, keys uniform over N", "ns per hit, wall time, fastest round", []series{
		{label: "stock cache, WriteMsg: " + allocs(bench.Stock, pathWriteMsg), color: figure.Red, marker: figure.Diamond{}, values: true,
			pts: pick(bench.Stock, pathWriteMsg, ns)},
		{label: "compactcache, WriteMsg: " + allocs(bench.Compact, pathWriteMsg), color: figure.Green, marker: draw.BoxGlyph{}, values: true, below: true,
			pts: pick(bench.Compact, pathWriteMsg, ns)},
		{label: "compactcache, raw bytes: " + allocs(bench.Compact, pathRaw), color: figure.Blue, marker: draw.CircleGlyph{}, values: true,
			pts: pick(bench.Compact, pathRaw, ns)},
	})
	if err != nil {
		return err
	}

	hits, rounds, passes, others := rows[0].Hits, rows[0].Rounds, rows[0].Passes, 0.0
	for _, r := range rows {
		others = max(others, r.Others)
	}
	f := &figure.Figure{
		Width: 16 * vg.Inch, Height: 10 * vg.Inch,
		Title:      "compactcache and the stock CoreDNS cache against the number of entries stored (N)",
		Cols:       2,
		Panels:     []figure.Panel{bytesPanel, hitPanel},
		LegendSide: figure.Below,
		LegendSize: 1.1 * vg.Inch,
		Notes: []string{
			"Each (cache, N) in a child process of its own, all N entries verified stored: every key queried, each hit with its own payload.",
			"Bytes: HeapInuse after runtime.GC() twice with the N entries stored, minus before, over N (compactcache's store mapped outside the heap counted in).",
			"Budgets: compactcache max(512 MiB, 512 B x N); stock 2N entries.",
			fmt.Sprintf("Hits: %d passes of %d a point, in rounds of %d, one goroutine, the queries' names built untimed in batches; plotted: the fastest round,",
				passes, hits, hits/max(1, rounds)),
			fmt.Sprintf("least disturbed by other work (up to %.0f%% of the cores busy with other processes) and by the GC (means over all hits in curve.csv).", 100*others),
			"WriteMsg: the writer packs the reply as the server does; raw: w.Write of the reply bytes.",
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
			v, err := figure.Values(s.pts, func(v float64) string { return fmt.Sprintf("%.0f", v) }, s.color, s.below)
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
