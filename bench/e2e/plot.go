//go:build linux

package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"github.com/compactcache/compactcache/bench/harness/figure"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotColors are the configs' colors, in the order the run lists them.
var plotColors = []color.Color{figure.Blue, figure.Orange, figure.Red, figure.Green, figure.Purple, figure.Gray}

// writePlot draws the server's CPU per query against the offered rate, a
// line per config (the median over the rounds at each rate), into a PNG
// file at path: what a lightly loaded server spends beside a busy one.
func (rep *report) writePlot(path string) error {
	p := figure.NewPlot("Server CPU per query against the offered load", "offered load, queries/s (log scale)", "server CPU µs per query (utime + stime)")
	l := figure.NewLegend()
	var ticks []plot.Tick
	lo, hi, top := math.Inf(1), math.Inf(-1), 0.0
	type line struct {
		spec  string
		color color.Color
		pts   plotter.XYs
	}
	var lines []line
	for i, g := range rep.groups() {
		var pts plotter.XYs
		for _, q := range rep.rates() {
			v := g.med(func(r *result) float64 {
				if ph := r.rate(q); ph != nil && ph.Err == "" {
					return ph.cpuPerQuery()
				}
				return 0
			})
			if v == 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(q), Y: v})
			lo, hi, top = min(lo, float64(q)), max(hi, float64(q)), max(top, v)
			if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == float64(q) }) {
				ticks = append(ticks, plot.Tick{Value: float64(q), Label: fmt.Sprint(q)})
			}
		}
		if len(pts) > 0 {
			lines = append(lines, line{g.spec, plotColors[i%len(plotColors)], pts})
		}
	}
	// A point's value goes under it where another line passes just above,
	// so that the two labels do not overprint.
	crowded := func(pt plotter.XY, self int) bool {
		for j, o := range lines {
			for _, q := range o.pts {
				if j != self && q.X == pt.X && q.Y > pt.Y && q.Y-pt.Y < top/12 {
					return true
				}
			}
		}
		return false
	}
	for i, ln := range lines {
		l2, err := figure.NewLine(ln.pts, ln.color, draw.CircleGlyph{}, vg.Points(5), false)
		if err != nil {
			return err
		}
		l2.AddTo(p, &l, ln.spec)
		var above, below plotter.XYs
		for _, pt := range ln.pts {
			if crowded(pt, i) {
				below = append(below, pt)
			} else {
				above = append(above, pt)
			}
		}
		for _, set := range []struct {
			pts   plotter.XYs
			below bool
		}{{above, false}, {below, true}} {
			if len(set.pts) == 0 {
				continue
			}
			v, err := figure.Values(set.pts, func(v float64) string { return fmt.Sprintf("%.1f", v) }, ln.color, set.below)
			if err != nil {
				return err
			}
			p.Add(v)
		}
	}
	if len(ticks) == 0 {
		return fmt.Errorf("no fixed-rate phase to plot")
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = lo/math.Pow(10, 0.15), hi*math.Pow(10, 0.15)
	p.Y.Min, p.Y.Max = 0, figure.RoundTop(top*1.1)
	f := &figure.Figure{
		Width: 10 * vg.Inch, Height: 7 * vg.Inch,
		Title:      "compactcache end to end, the server on one core",
		Cols:       1,
		Panels:     []figure.Panel{{Plot: p, Legend: l}},
		LegendSide: figure.Below,
		LegendSize: 1.1 * vg.Inch,
		Notes: []string{
			fmt.Sprintf("bash bench/e2e/run.sh: dnsperf at each fixed rate for %s, N = %d entries, all hits; medians over the rounds.", rep.Options["duration"], rep.n()),
			"CPU: the server process's utime + stime over the phase, per query answered.",
		},
	}
	return f.Save(path)
}
