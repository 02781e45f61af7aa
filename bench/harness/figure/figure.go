// Package figure draws the benchmarks' figures (bench/report's -plot) with
// gonum.org/v1/plot: panels in a grid with their plot areas aligned, a title
// and a subtitle above them, each panel's legend beside or under it, notes
// under the grid, written as a PNG.
package figure

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// DPI of the PNGs: a figure W by H inches wide is written 100W by 100H pixels.
const DPI = 100

// The colours of the figures (matplotlib's first ones), and their greys.
var (
	Blue   = color.RGBA{31, 119, 180, 255}
	Orange = color.RGBA{255, 127, 14, 255}
	Green  = color.RGBA{44, 160, 44, 255}
	Red    = color.RGBA{214, 39, 40, 255}
	Purple = color.RGBA{148, 103, 189, 255}
	Gray   = color.RGBA{110, 110, 110, 255}
	Light  = color.RGBA{225, 225, 225, 255}
)

var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// Style is text in the figures' font at size points.
func Style(size vg.Length, c color.Color) text.Style {
	return text.Style{Color: c, Font: font.From(sans, size), Handler: plot.DefaultTextHandler}
}

// NewPlot returns a panel in the figures' font, its axes meeting at the data's
// edges, with a light grid behind the data.
func NewPlot(title, xlabel, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font = font.From(sans, 13)
	p.Title.Padding = vg.Points(8)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 12)
		a.Tick.Label.Font = font.From(sans, 11)
		a.Padding = 0
	}
	p.X.Label.Text, p.Y.Label.Text = xlabel, ylabel
	p.X.Tick.Marker, p.Y.Tick.Marker = RoundTicks{}, RoundTicks{}
	g := plotter.NewGrid()
	g.Vertical.Color, g.Horizontal.Color = Light, Light
	g.Vertical.Dashes, g.Horizontal.Dashes = nil, nil
	p.Add(g)
	return p
}

// NewLegend returns a legend in the figures' font, its keys at the left.
func NewLegend() plot.Legend {
	l := plot.NewLegend()
	l.TextStyle = Style(12, color.Black)
	l.Left, l.Top = true, true
	l.ThumbnailWidth = vg.Points(30)
	l.Padding = vg.Points(4)
	return l
}

// Line is a series: a line through pts, 2 points wide, dashed or not, with a
// marker of shape at each point (none where shape is nil).
type Line struct {
	Line    *plotter.Line
	Markers *plotter.Scatter
}

// NewLine returns the series of pts in c.
func NewLine(pts plotter.XYs, c color.Color, shape draw.GlyphDrawer, radius vg.Length, dashed bool) (Line, error) {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return Line{}, err
	}
	l.Color, l.Width = c, vg.Points(2)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	}
	s := Line{Line: l}
	if shape != nil {
		if s.Markers, err = plotter.NewScatter(pts); err != nil {
			return Line{}, err
		}
		s.Markers.GlyphStyle = draw.GlyphStyle{Color: c, Radius: radius, Shape: shape}
	}
	return s, nil
}

// AddTo adds the series to p and its key, named name, to l.
func (s Line) AddTo(p *plot.Plot, l *plot.Legend, name string) {
	p.Add(s.Line)
	if s.Markers == nil {
		l.Add(name, s.Line)
		return
	}
	p.Add(s.Markers)
	l.Add(name, s.Line, s.Markers)
}

// Values labels each point of pts with its value written by format, in c,
// above the point or below it.
func Values(pts plotter.XYs, format func(float64) string, c color.Color, below bool) (*plotter.Labels, error) {
	labels := make([]string, len(pts))
	for i, pt := range pts {
		labels[i] = format(pt.Y)
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i] = Style(12, c)
		l.TextStyle[i].XAlign = draw.XCenter
		if below {
			l.TextStyle[i].YAlign = draw.YTop
		}
	}
	l.Offset.Y = vg.Points(8)
	if below {
		l.Offset.Y = -l.Offset.Y
	}
	return l, nil
}

// Diamond is a marker: a square standing on a corner.
type Diamond struct{}

// DrawGlyph implements draw.GlyphDrawer.
func (Diamond) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetColor(sty.Color)
	r := sty.Radius * 1.25
	var p vg.Path
	p.Move(vg.Point{X: pt.X, Y: pt.Y + r})
	p.Line(vg.Point{X: pt.X + r, Y: pt.Y})
	p.Line(vg.Point{X: pt.X, Y: pt.Y - r})
	p.Line(vg.Point{X: pt.X - r, Y: pt.Y})
	p.Close()
	c.Fill(p)
}

// RoundTicks mark the multiples of a round step (1, 2, 2.5 or 5 times a
// power of ten) that cuts the axis into about five, with a minor tick
// halfway, labelled 20K rather than 20000 from 10,000 up.
type RoundTicks struct{}

// Ticks implements plot.Ticker.
func (RoundTicks) Ticks(lo, hi float64) []plot.Tick {
	step := NiceCeil((hi - lo) / 5)
	decimals := 0
	for d := step; d < 1 && decimals < 6; d *= 10 {
		decimals++
	}
	if step < 1 && math.Abs(step*math.Pow(10, float64(decimals))-math.Round(step*math.Pow(10, float64(decimals)))) > 1e-9 {
		decimals++
	}
	var ticks []plot.Tick
	for k := math.Ceil(lo / step * (1 - 1e-9)); k*step <= hi+step*1e-9; k++ {
		v := k * step
		label := strconv.FormatFloat(v, 'f', decimals, 64)
		if v >= 10000 && math.Mod(v, 1000) == 0 {
			label = strconv.FormatFloat(v/1000, 'f', -1, 64) + "K"
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: label})
		if m := v + step/2; m < hi {
			ticks = append(ticks, plot.Tick{Value: m})
		}
	}
	return ticks
}

// NiceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func NiceCeil(v float64) float64 {
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

// RoundTop returns v rounded up to a multiple of a round step (1, 2, 2.5 or
// 5 times a power of ten) that cuts it into about five: the top of a y axis
// whose data reach v.
func RoundTop(v float64) float64 {
	step := NiceCeil(v / 5)
	return math.Ceil(v/step*(1-1e-9)) * step
}

// Side is where a panel's legend goes.
type Side int

const (
	Below Side = iota // in a band under the panel, centred
	Right             // in a band right of the panel, at its top
)

// Panel is a plot and its legend.
type Panel struct {
	Plot   *plot.Plot
	Legend plot.Legend
}

// Figure is panels in a grid of Cols columns, row after row.
type Figure struct {
	Width, Height   vg.Length
	Title, Subtitle string
	Cols            int
	Panels          []Panel
	LegendSide      Side
	LegendSize      vg.Length // the legend band's height (Below) or width (Right)
	Notes           []string  // lines under the grid
}

// Draw draws the figure onto c.
func (f *Figure) Draw(c draw.Canvas) {
	c.SetColor(color.White)
	c.Fill(c.Rectangle.Path())

	top := c.Max.Y - vg.Points(12)
	title := Style(18, color.Black)
	title.XAlign, title.YAlign = draw.XCenter, draw.YTop
	mid := (c.Min.X + c.Max.X) / 2
	c.FillText(title, vg.Point{X: mid, Y: top}, f.Title)
	top -= title.Height(f.Title) + vg.Points(6)
	if f.Subtitle != "" {
		sub := Style(13, Gray)
		sub.XAlign, sub.YAlign = draw.XCenter, draw.YTop
		c.FillText(sub, vg.Point{X: mid, Y: top}, f.Subtitle)
		top -= sub.Height(f.Subtitle) + vg.Points(6)
	}
	top -= vg.Points(6)

	note := Style(11, Gray)
	bottom := c.Min.Y + vg.Points(12)
	for i := len(f.Notes) - 1; i >= 0; i-- {
		c.FillText(note, vg.Point{X: c.Min.X + vg.Points(24), Y: bottom}, f.Notes[i])
		bottom += note.Height(f.Notes[i]) * 1.3
	}
	if len(f.Notes) > 0 {
		bottom += vg.Points(8)
	}

	cols := max(f.Cols, 1)
	rows := (len(f.Panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range f.Panels {
		grid[i/cols][i%cols] = p.Plot
	}
	area := draw.Crop(c, 0, 0, bottom-c.Min.Y, top-c.Max.Y)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(24), PadY: vg.Points(16), PadLeft: vg.Points(12), PadRight: vg.Points(18)}
	if f.LegendSide == Below {
		tiles.PadBottom = f.LegendSize
		tiles.PadY += f.LegendSize
	} else {
		tiles.PadRight += f.LegendSize
		tiles.PadX += f.LegendSize
	}
	canvases := plot.Align(grid, tiles, area)
	for i, p := range f.Panels {
		pc := canvases[i/cols][i%cols]
		p.Plot.Draw(pc)
		l := p.Legend
		r := l.Rectangle(pc)
		w, h := r.Max.X-r.Min.X, r.Max.Y-r.Min.Y
		var lc draw.Canvas
		if f.LegendSide == Below {
			x := (pc.Min.X + pc.Max.X - w) / 2
			y := pc.Min.Y - vg.Points(10)
			lc = draw.Canvas{Canvas: pc.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: x, Y: y - h}, Max: vg.Point{X: x + w, Y: y}}}
		} else {
			x := pc.Max.X + vg.Points(12)
			y := pc.Max.Y - vg.Points(40)
			lc = draw.Canvas{Canvas: pc.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: x, Y: y - h}, Max: vg.Point{X: x + w, Y: y}}}
		}
		l.Draw(lc)
	}
}

// Save writes the figure as a PNG at path.
func (f *Figure) Save(path string) error {
	if len(f.Panels) == 0 {
		return fmt.Errorf("%s: no panels to draw", filepath.Base(path))
	}
	img := vgimg.NewWith(vgimg.UseWH(f.Width, f.Height), vgimg.UseDPI(DPI))
	f.Draw(draw.New(img))
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
