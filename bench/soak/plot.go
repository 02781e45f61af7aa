//go:build linux

package main

import (
	"fmt"
	"image/color"
	"math"

	"github.com/compactcache/compactcache/bench/figure"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The plot: four line charts, one above the other, sharing the time axis:
// memory, the store against its budget, throughput and errors.

type series struct {
	name   string
	color  color.Color
	values []float64
	dashed bool
}

type panel struct {
	title  string
	unit   string // the y axis label
	series []series
	minTop float64 // the least top of the y axis
}

// renderPNG draws the samples' charts into path, under title and subtitle.
func renderPNG(path, title, subtitle string, samples []sample) error {
	if len(samples) == 0 {
		return fmt.Errorf("no samples to plot")
	}
	xs := make([]float64, len(samples))
	col := func(f func(s sample) float64) []float64 {
		v := make([]float64, len(samples))
		for i, s := range samples {
			v[i] = f(s)
		}
		return v
	}
	for i, s := range samples {
		xs[i] = s.Elapsed / 60
	}
	const mib = 1 << 20
	panels := []panel{
		{
			title: "memory of the server process",
			unit:  "MiB",
			series: []series{
				{name: "RSS (VmRSS)", color: figure.Blue, values: col(func(s sample) float64 { return float64(s.RSS) / mib })},
				{name: "Go heap in use", color: figure.Orange, values: col(func(s sample) float64 { return float64(s.HeapInuse) / mib })},
			},
		},
		{
			title: "cache store against its budget",
			unit:  "MiB",
			series: []series{
				{name: "store (compactcache_bytes)", color: figure.Green, values: col(func(s sample) float64 { return float64(s.StoreBytes) / mib })},
				{name: "budget (capacity)", color: figure.Red, dashed: true, values: col(func(s sample) float64 { return float64(s.Capacity) / mib })},
			},
		},
		{
			title: "throughput",
			unit:  "queries/s",
			series: []series{
				{name: "sent (dnsperf)", color: figure.Gray, dashed: true, values: col(func(s sample) float64 { return float64(s.Sent) / max(s.Interval, 1) })},
				{name: "answered", color: figure.Blue, values: col(func(s sample) float64 { return s.QPS })},
				{name: "cache hits", color: figure.Green, values: col(func(s sample) float64 { return float64(s.Hits) / s.Interval })},
				{name: "cache misses", color: figure.Orange, values: col(func(s sample) float64 { return float64(s.Misses) / s.Interval })},
			},
		},
		{
			title:  "errors per interval",
			unit:   "queries",
			minTop: 5,
			series: []series{
				{name: "lost (no reply)", color: figure.Red, values: col(func(s sample) float64 { return float64(s.Lost) })},
				{name: "SERVFAIL", color: figure.Orange, values: col(func(s sample) float64 { return float64(s.ServFail) })},
				{name: "other rcodes", color: figure.Purple, values: col(func(s sample) float64 { return float64(s.Other) })},
			},
		},
	}

	// The time axis ends at the round figure at or after the last sample,
	// or the one just before it when the last sample passes it by less than
	// 2% (dnsperf runs a little over each interval).
	last := max(xs[len(xs)-1], 1e-3)
	xstep := figure.NiceCeil(last / 10)
	xmax := math.Ceil(last/1.02/xstep) * xstep

	f := &figure.Figure{
		Width: 14 * vg.Inch, Height: 20 * vg.Inch,
		Title: title, Subtitle: subtitle,
		Cols:       1,
		LegendSide: figure.Right,
		LegendSize: 2.6 * vg.Inch,
	}
	for i, pn := range panels {
		xlabel := ""
		if i == len(panels)-1 {
			xlabel = "minutes since the start of the load"
		}
		p := figure.NewPlot(pn.title, xlabel, pn.unit)
		l := figure.NewLegend()
		top := 0.0
		for _, s := range pn.series {
			pts := make(plotter.XYs, len(xs))
			for k := range xs {
				pts[k] = plotter.XY{X: xs[k], Y: s.values[k]}
				top = max(top, s.values[k])
			}
			line, err := figure.NewLine(pts, s.color, draw.BoxGlyph{}, vg.Points(1.5), s.dashed)
			if err != nil {
				return err
			}
			line.AddTo(p, &l, s.name)
		}
		p.X.Min, p.X.Max = 0, xmax
		p.Y.Min, p.Y.Max = 0, figure.NiceCeil(max(top*1.05, pn.minTop, 1))
		f.Panels = append(f.Panels, figure.Panel{Plot: p, Legend: l})
	}
	return f.Save(path)
}
