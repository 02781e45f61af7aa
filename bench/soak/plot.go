//go:build linux

package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
)

// The plot: three line charts, one above the other, sharing the time axis:
// memory, throughput and errors. Only the standard library draws them.

var (
	white  = color.RGBA{255, 255, 255, 255}
	black  = color.RGBA{0, 0, 0, 255}
	grid   = color.RGBA{225, 225, 225, 255}
	gray   = color.RGBA{110, 110, 110, 255}
	blue   = color.RGBA{31, 119, 180, 255}
	orange = color.RGBA{255, 127, 14, 255}
	green  = color.RGBA{44, 160, 44, 255}
	red    = color.RGBA{214, 39, 40, 255}
	purple = color.RGBA{148, 103, 189, 255}
)

type series struct {
	name   string
	color  color.RGBA
	values []float64
	dashed bool
}

type panel struct {
	title  string
	unit   string // the y axis label
	series []series
	minTop float64 // the least top of the y axis
}

const (
	plotW     = 1400
	panelH    = 380
	marginL   = 120
	marginR   = 40
	marginTop = 110 // above each panel's chart: the tick labels of the one above, its title and legend
	marginBot = 50  // below the last chart: the time axis labels
	scale     = 2   // font scale
)

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
				{name: "RSS (VmRSS)", color: blue, values: col(func(s sample) float64 { return float64(s.RSS) / mib })},
				{name: "Go heap in use", color: orange, values: col(func(s sample) float64 { return float64(s.HeapInuse) / mib })},
			},
		},
		{
			title: "cache store against its budget",
			unit:  "MiB",
			series: []series{
				{name: "store (compactcache_bytes)", color: green, values: col(func(s sample) float64 { return float64(s.StoreBytes) / mib })},
				{name: "budget (capacity)", color: red, dashed: true, values: col(func(s sample) float64 { return float64(s.Capacity) / mib })},
			},
		},
		{
			title: "throughput",
			unit:  "queries/s",
			series: []series{
				{name: "sent (dnsperf)", color: gray, dashed: true, values: col(func(s sample) float64 { return float64(s.Sent) / max(s.Interval, 1) })},
				{name: "answered", color: blue, values: col(func(s sample) float64 { return s.QPS })},
				{name: "cache hits", color: green, values: col(func(s sample) float64 { return float64(s.Hits) / s.Interval })},
				{name: "cache misses", color: orange, values: col(func(s sample) float64 { return float64(s.Misses) / s.Interval })},
			},
		},
		{
			title:  "errors per interval",
			unit:   "queries",
			minTop: 5,
			series: []series{
				{name: "lost (no reply)", color: red, values: col(func(s sample) float64 { return float64(s.Lost) })},
				{name: "SERVFAIL", color: orange, values: col(func(s sample) float64 { return float64(s.ServFail) })},
				{name: "other rcodes", color: purple, values: col(func(s sample) float64 { return float64(s.Other) })},
			},
		},
	}

	headerH := 60
	h := headerH + len(panels)*(panelH+marginTop) + marginBot
	img := image.NewRGBA(image.Rect(0, 0, plotW, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{white}, image.Point{}, draw.Src)
	drawText(img, (plotW-textWidth(title, scale+1))/2, 14, title, scale+1, black)
	drawText(img, (plotW-textWidth(subtitle, scale))/2, 48, subtitle, scale, gray)

	// The time axis ends at the tick at or after the last sample, or the
	// one just before it when the last sample passes it by less than 2%
	// (dnsperf runs a little over each interval).
	last := max(xs[len(xs)-1], 1e-3)
	xstep := niceStep(last, 10)
	xmax := math.Ceil(last/1.02/xstep) * xstep
	for i, p := range panels {
		top := headerH + i*(panelH+marginTop) + marginTop
		r := image.Rect(marginL, top, plotW-marginR, top+panelH)
		drawPanel(img, r, p, xs, xmax, xstep)
	}
	label := "minutes since the start of the load"
	drawText(img, (plotW-textWidth(label, scale))/2, h-22, label, scale, black)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func drawPanel(img *image.RGBA, r image.Rectangle, p panel, xs []float64, xmax, xstep float64) {
	// Title and legend above the chart.
	drawText(img, r.Min.X, r.Min.Y-56, p.title, scale, black)
	lx := r.Min.X
	for _, s := range p.series {
		fillRect(img, image.Rect(lx, r.Min.Y-26, lx+24, r.Min.Y-14), s.color)
		drawText(img, lx+30, r.Min.Y-27, s.name, scale, black)
		lx += 30 + textWidth(s.name, scale) + 40
	}

	ymax := 0.0
	for _, s := range p.series {
		for _, v := range s.values {
			ymax = max(ymax, v)
		}
	}
	ymax = niceCeil(max(ymax*1.05, p.minTop, 1))
	ystep := niceStep(ymax, 5)

	px := func(x float64) int { return r.Min.X + int(math.Round(x/xmax*float64(r.Dx()))) }
	py := func(y float64) int { return r.Max.Y - int(math.Round(y/ymax*float64(r.Dy()))) }

	// Grid and tick labels.
	for y := 0.0; y <= ymax+ystep/2; y += ystep {
		hline(img, r.Min.X, r.Max.X, py(y), grid)
		l := tickLabel(y, ystep)
		drawText(img, r.Min.X-12-textWidth(l, scale), py(y)-glyphH*scale/2, l, scale, black)
	}
	for x := 0.0; x <= xmax+xstep/2; x += xstep {
		vline(img, px(x), r.Min.Y, r.Max.Y, grid)
		l := tickLabel(x, xstep)
		drawText(img, px(x)-textWidth(l, scale)/2, r.Max.Y+10, l, scale, black)
	}
	drawTextUp(img, r.Min.X-marginL+14, r.Min.Y+r.Dy()/2+textWidth(p.unit, scale)/2, p.unit, scale, gray)

	// The series, then the frame over them.
	for _, s := range p.series {
		for i := range xs {
			x, y := px(xs[i]), py(s.values[i])
			fillRect(img, image.Rect(x-2, y-2, x+3, y+3), s.color)
			if i == 0 {
				continue
			}
			line(img, px(xs[i-1]), py(s.values[i-1]), x, y, s.color, s.dashed)
		}
	}
	hline(img, r.Min.X, r.Max.X, r.Min.Y, black)
	hline(img, r.Min.X, r.Max.X, r.Max.Y, black)
	vline(img, r.Min.X, r.Min.Y, r.Max.Y, black)
	vline(img, r.Max.X, r.Min.Y, r.Max.Y, black)
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// niceStep returns a round step that cuts [0, span] into about n parts.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if raw <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

func tickLabel(v, step float64) string {
	decimals := 0
	if step < 1 {
		decimals = int(math.Ceil(-math.Log10(step)))
		if math.Abs(step*math.Pow(10, float64(decimals))-math.Round(step*math.Pow(10, float64(decimals)))) > 1e-9 {
			decimals++
		}
	}
	if v >= 10000 && step >= 1000 && math.Mod(v, 1000) == 0 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "K"
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

func fillRect(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r.Intersect(img.Bounds()), &image.Uniform{c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

// line draws a segment two pixels thick (Bresenham); dashed leaves gaps.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color, dashed bool) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for n := 0; ; n++ {
		if !dashed || n%16 < 10 {
			img.Set(x0, y0, c)
			img.Set(x0+1, y0, c)
			img.Set(x0, y0+1, c)
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
