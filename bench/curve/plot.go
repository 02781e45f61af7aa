package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"

	"github.com/compactcache/compactcache/bench"
)

// The figure: a title, two panels side by side (bytes per entry against N,
// hit ns/op against N, N on a log scale), and notes on the method below.
const (
	figW, figH = 1600, 1000

	plotTop, plotBottom = 100, 580
	leftX0, leftX1      = 120, 760
	rightX0, rightX1    = 920, 1560
	legendTop           = plotBottom + 80

	textScale = 2
	textH     = glyphH * textScale
)

var (
	white     = color.RGBA{255, 255, 255, 255}
	black     = color.RGBA{0, 0, 0, 255}
	gridColor = color.RGBA{225, 225, 225, 255}
	noteColor = color.RGBA{70, 70, 70, 255}

	rawColor   = color.RGBA{31, 119, 180, 255} // compactcache, raw writes
	msgColor   = color.RGBA{44, 160, 44, 255}  // compactcache, WriteMsg
	stockColor = color.RGBA{214, 39, 40, 255}  // the stock cache
	refColor   = color.RGBA{130, 130, 130, 255}
)

type marker int

const (
	circle marker = iota
	square
	diamond
	none
)

// series is one line of a panel.
type series struct {
	label  string
	color  color.RGBA
	marker marker
	dashed bool
	values bool // label each point with its value
	pts    [][2]float64
}

type panel struct {
	x0, x1         int // the plot area's left and right edges
	title, ylabel  string
	note           []string // lines under the legend's keys
	series         []series
	xmin, xmax     float64 // log10 of N
	ymax, ystep    float64
	taken          []image.Rectangle // labels and the legend placed so far
	samples        []image.Point     // points along the lines, which labels avoid
	valueFormatter func(float64) string
}

// writePNG draws rows into a PNG file at path.
func writePNG(path string, rows []row) error {
	if len(rows) == 0 {
		return fmt.Errorf("no figures to plot")
	}
	img := image.NewRGBA(image.Rect(0, 0, figW, figH))
	draw.Draw(img, img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)

	pick := func(kind bench.Kind, path string, f func(row) float64) [][2]float64 {
		var pts [][2]float64
		for _, r := range rows {
			if r.Cache == kind && (path == "" || r.Path == path) &&
				!slices.ContainsFunc(pts, func(p [2]float64) bool { return p[0] == float64(r.N) }) {
				pts = append(pts, [2]float64{float64(r.N), f(r)})
			}
		}
		slices.SortFunc(pts, func(a, b [2]float64) int { return int(a[0] - b[0]) })
		return pts
	}
	allocs := func(kind bench.Kind, path string) string {
		hi := 0.0
		for _, p := range pick(kind, path, func(r row) float64 { return r.HitAllocs }) {
			hi = max(hi, p[1])
		}
		if hi < 0.005 {
			return "0 allocs/hit"
		}
		return fmt.Sprintf("<= %.1f allocs/hit", hi)
	}
	heap := func(r row) float64 { return r.HeapInuse }
	ns := func(r row) float64 { return r.HitBestNs }
	payload := func(r row) float64 { return r.Payload }

	bytesPanel := &panel{
		x0: leftX0, x1: leftX1,
		title:  "Heap bytes per entry stored",
		ylabel: "bytes per entry (HeapInuse after GC)",
		series: []series{
			{label: "stock cache", color: stockColor, marker: diamond, values: true, pts: pick(bench.Stock, "", heap)},
			{label: "compactcache", color: rawColor, marker: circle, values: true, pts: pick(bench.Compact, "", heap)},
			{label: "payload (the information held)", color: refColor, marker: none, dashed: true, pts: pick(bench.Compact, "", payload)},
		},
		valueFormatter: func(v float64) string { return fmt.Sprintf("%.0f", v) },
	}
	hitPanel := &panel{
		x0: rightX0, x1: rightX1,
		title:  "Hit through ServeDNS, keys uniform over N",
		ylabel: "ns per hit, wall time, fastest round",
		series: []series{
			{label: "stock cache, WriteMsg: " + allocs(bench.Stock, pathWriteMsg), color: stockColor, marker: diamond, values: true,
				pts: pick(bench.Stock, pathWriteMsg, ns)},
			{label: "compactcache, WriteMsg: " + allocs(bench.Compact, pathWriteMsg), color: msgColor, marker: square, values: true,
				pts: pick(bench.Compact, pathWriteMsg, ns)},
			{label: "compactcache, raw bytes: " + allocs(bench.Compact, pathRaw), color: rawColor, marker: circle, values: true,
				pts: pick(bench.Compact, pathRaw, ns)},
		},
		valueFormatter: func(v float64) string { return fmt.Sprintf("%.0f", v) },
	}
	if len(bytesPanel.series[2].pts) == 0 { // no compactcache rows: payload from the stock cache's
		bytesPanel.series[2].pts = pick(bench.Stock, "", payload)
	}

	title := "compactcache and the stock CoreDNS cache against the number of entries stored (N)"
	drawText(img, (figW-textWidth(title, 3))/2, 24, title, 3, black)
	for _, p := range []*panel{bytesPanel, hitPanel} {
		p.draw(img)
	}

	hits, rounds, passes, others := rows[0].Hits, rows[0].Rounds, rows[0].Passes, 0.0
	for _, r := range rows {
		others = max(others, r.Others)
	}
	notes := []string{
		"Each (cache, N) in a child process of its own, all N entries verified stored: every key queried, each hit",
		"with its own payload. Bytes: HeapInuse after runtime.GC() twice with the N entries stored, minus before, over N",
		"(compactcache's store mapped outside the heap counted in). Budgets: compactcache max(512 MiB, 512 B x N); stock 2N entries.",
		fmt.Sprintf("Hits: %d passes of %d a point, in rounds of %d, one goroutine, the queries' names built untimed in batches;", passes, hits, hits/max(1, rounds)),
		fmt.Sprintf("plotted: the fastest round, least disturbed by other work (up to %.0f%% of the cores busy with other processes)", 100*others),
		"and by the GC (means over all hits in curve.csv).",
		"WriteMsg: the writer packs the reply as the server does; raw: w.Write of the reply bytes.",
	}
	for k, s := range notes {
		drawText(img, 40, figH-40-(len(notes)-k)*(textH+8)+textH, s, textScale, noteColor)
	}

	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func (p *panel) x(n float64) int {
	return p.x0 + int(math.Round((math.Log10(n)-p.xmin)/(p.xmax-p.xmin)*float64(p.x1-p.x0)))
}

func (p *panel) y(v float64) int {
	return plotBottom - int(math.Round(v/p.ymax*float64(plotBottom-plotTop)))
}

func (p *panel) draw(img *image.RGBA) {
	// Scales: x over the Ns with a margin, y from 0 to a round figure above
	// the largest value.
	lo, hi, top := math.Inf(1), math.Inf(-1), 0.0
	var ns []float64
	for _, s := range p.series {
		for _, pt := range s.pts {
			lo, hi, top = min(lo, pt[0]), max(hi, pt[0]), max(top, pt[1])
			if !slices.Contains(ns, pt[0]) {
				ns = append(ns, pt[0])
			}
		}
	}
	if len(ns) == 0 {
		return
	}
	p.xmin, p.xmax = math.Log10(lo)-0.2, math.Log10(hi)+0.2
	p.ystep = niceStep(top * 1.1 / 5)
	p.ymax = math.Ceil(top*1.1/p.ystep) * p.ystep

	// Grid, ticks and their labels.
	for v := 0.0; v <= p.ymax+p.ystep/2; v += p.ystep {
		y := p.y(v)
		fill(img, image.Rect(p.x0, y, p.x1, y+1), gridColor)
		fill(img, image.Rect(p.x0-8, y, p.x0, y+1), black)
		s := fmt.Sprintf("%.0f", v)
		drawText(img, p.x0-12-textWidth(s, textScale), y-textH/2+1, s, textScale, black)
	}
	for _, n := range ns {
		x := p.x(n)
		fill(img, image.Rect(x, plotTop, x+1, plotBottom), gridColor)
		fill(img, image.Rect(x, plotBottom, x+1, plotBottom+8), black)
		s := formatN(n)
		drawText(img, x-textWidth(s, textScale)/2, plotBottom+14, s, textScale, black)
	}
	fill(img, image.Rect(p.x0, plotTop, p.x0+2, plotBottom+1), black)
	fill(img, image.Rect(p.x0, plotBottom, p.x1, plotBottom+2), black)

	drawText(img, (p.x0+p.x1-textWidth(p.title, textScale))/2, plotTop-30, p.title, textScale, black)
	xl := "entries stored, N (log scale)"
	drawText(img, (p.x0+p.x1-textWidth(xl, textScale))/2, plotBottom+44, xl, textScale, black)
	drawTextUp(img, p.x0-110, (plotTop+plotBottom-textWidth(p.ylabel, textScale))/2, p.ylabel, textScale, black)

	// Lines, then markers over them.
	for _, s := range p.series {
		for k := 1; k < len(s.pts); k++ {
			a := image.Pt(p.x(s.pts[k-1][0]), p.y(s.pts[k-1][1]))
			b := image.Pt(p.x(s.pts[k][0]), p.y(s.pts[k][1]))
			p.line(img, a, b, s.color, s.dashed)
		}
	}
	for _, s := range p.series {
		for _, pt := range s.pts {
			c := image.Pt(p.x(pt[0]), p.y(pt[1]))
			drawMarker(img, c, s.marker, s.color)
			if s.marker != none {
				p.taken = append(p.taken, image.Rect(c.X-7, c.Y-7, c.X+8, c.Y+8))
			}
		}
	}

	p.legend(img)

	// Value labels, where they fit without covering a line, a marker or
	// another label.
	for _, s := range p.series {
		if !s.values {
			continue
		}
		for _, pt := range s.pts {
			c := image.Pt(p.x(pt[0]), p.y(pt[1]))
			v := p.valueFormatter(pt[1])
			w := textWidth(v, textScale)
			for _, at := range []image.Point{
				{c.X - w/2, c.Y - 12 - textH}, // above
				{c.X - w/2, c.Y + 12},         // below
				{c.X + 12, c.Y - 12 - textH},  // above right
				{c.X + 12, c.Y + 8},           // below right
				{c.X - 12 - w, c.Y - 12 - textH},
				{c.X - 12 - w, c.Y + 8},
			} {
				r := image.Rect(at.X-2, at.Y-2, at.X+w+2, at.Y+textH)
				if p.free(r) {
					drawText(img, at.X, at.Y, v, textScale, s.color)
					p.taken = append(p.taken, r)
					break
				}
			}
		}
	}
}

// legend draws the series' keys in a box under the panel's x axis label.
func (p *panel) legend(img *image.RGBA) {
	const row, swatch, pad = 28, 44, 12
	var keys []series
	w := 0
	for _, s := range p.series {
		if s.label != "" {
			keys = append(keys, s)
			w = max(w, textWidth(s.label, textScale)+swatch+pad)
		}
	}
	for _, s := range p.note {
		w = max(w, textWidth(s, textScale))
	}
	w += 2 * pad
	h := (len(keys)+len(p.note))*row + pad
	x := (p.x0 + p.x1 - w) / 2
	box := image.Rect(x, legendTop, x+w, legendTop+h)
	outline(img, box, refColor)
	for k, s := range p.note {
		drawText(img, box.Min.X+pad, box.Min.Y+pad+(len(keys)+k)*row+2, s, textScale, noteColor)
	}
	for k, s := range keys {
		y := box.Min.Y + pad + k*row + textH/2
		a, b := image.Pt(box.Min.X+pad, y), image.Pt(box.Min.X+pad+swatch, y)
		p.stroke(img, a, b, s.color, s.dashed)
		drawMarker(img, image.Pt((a.X+b.X)/2, y), s.marker, s.color)
		drawText(img, b.X+pad, y-textH/2+2, s.label, textScale, black)
	}
}

// free reports whether r lies in the plot area clear of lines, markers,
// labels and the legend.
func (p *panel) free(r image.Rectangle) bool {
	if !r.In(image.Rect(p.x0+4, plotTop, p.x1, plotBottom-2)) {
		return false
	}
	for _, t := range p.taken {
		if r.Overlaps(t) {
			return false
		}
	}
	for _, s := range p.samples {
		if s.In(r.Inset(-3)) {
			return false
		}
	}
	return true
}

// line draws a series' segment and remembers its points.
func (p *panel) line(img *image.RGBA, a, b image.Point, c color.RGBA, dashed bool) {
	p.stroke(img, a, b, c, dashed)
	d := math.Hypot(float64(b.X-a.X), float64(b.Y-a.Y))
	for t := 0.0; t <= d; t += 2 {
		f := t / max(d, 1)
		p.samples = append(p.samples, image.Pt(a.X+int(f*float64(b.X-a.X)), a.Y+int(f*float64(b.Y-a.Y))))
	}
}

// stroke draws a 3-pixel line from a to b, dashed or not.
func (p *panel) stroke(img *image.RGBA, a, b image.Point, c color.RGBA, dashed bool) {
	d := math.Hypot(float64(b.X-a.X), float64(b.Y-a.Y))
	for t := 0.0; t <= d; t += 0.5 {
		if dashed && math.Mod(t, 14) >= 8 {
			continue
		}
		f := t / max(d, 1)
		x := float64(a.X) + f*float64(b.X-a.X)
		y := float64(a.Y) + f*float64(b.Y-a.Y)
		disc(img, x, y, 1.6, c)
	}
}

func disc(img *image.RGBA, cx, cy, r float64, c color.RGBA) {
	for y := int(cy - r - 1); y <= int(cy+r+1); y++ {
		for x := int(cx - r - 1); x <= int(cx+r+1); x++ {
			if math.Hypot(float64(x)-cx, float64(y)-cy) <= r {
				img.SetRGBA(x, y, c)
			}
		}
	}
}

func drawMarker(img *image.RGBA, c image.Point, m marker, col color.RGBA) {
	const r = 6
	for dy := -r - 1; dy <= r+1; dy++ {
		for dx := -r - 1; dx <= r+1; dx++ {
			var in bool
			switch m {
			case circle:
				in = dx*dx+dy*dy <= r*r
			case square:
				in = max(abs(dx), abs(dy)) <= r-1
			case diamond:
				in = abs(dx)+abs(dy) <= r+1
			}
			if in {
				img.SetRGBA(c.X+dx, c.Y+dy, col)
			}
		}
	}
}

func abs(x int) int { return max(x, -x) }

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func outline(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	fill(img, image.Rect(r.Min.X, r.Min.Y, r.Max.X, r.Min.Y+1), c)
	fill(img, image.Rect(r.Min.X, r.Max.Y-1, r.Max.X, r.Max.Y), c)
	fill(img, image.Rect(r.Min.X, r.Min.Y, r.Min.X+1, r.Max.Y), c)
	fill(img, image.Rect(r.Max.X-1, r.Min.Y, r.Max.X, r.Max.Y), c)
}

// niceStep returns the smallest of 1, 2, 2.5 and 5 times a power of ten at
// least raw.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
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
