package figure

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

func TestNiceCeil(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{0, 1}, {0.3, 0.5}, {1, 1}, {1.1, 2}, {2.2, 2.5}, {4, 5}, {7, 10}, {199, 200}, {201, 250}, {6457, 10000},
	} {
		if got := NiceCeil(c.in); got != c.want {
			t.Errorf("NiceCeil(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want float64 }{{1161.6, 1250}, {6457, 8000}, {1000, 1000}, {9.5, 10}} {
		if got := RoundTop(c.in); got != c.want {
			t.Errorf("RoundTop(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestRoundTicks(t *testing.T) {
	labels := func(lo, hi float64) []string {
		var l []string
		for _, tk := range (RoundTicks{}).Ticks(lo, hi) {
			if tk.Label != "" {
				l = append(l, tk.Label)
			}
		}
		return l
	}
	for _, c := range []struct {
		lo, hi float64
		want   []string
	}{
		{0, 200, []string{"0", "50", "100", "150", "200"}},
		{0, 20000, []string{"0", "5000", "10K", "15K", "20K"}},
		{0, 10, []string{"0", "2", "4", "6", "8", "10"}},
		{0, 1, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}},
		{0, 1.25, []string{"0.00", "0.25", "0.50", "0.75", "1.00", "1.25"}},
	} {
		if got := labels(c.lo, c.hi); !slices.Equal(got, c.want) {
			t.Errorf("ticks of [%v, %v]: %q, want %q", c.lo, c.hi, got, c.want)
		}
	}
}

// TestSave draws a figure of two panels, a legend and notes into a PNG.
func TestSave(t *testing.T) {
	var panels []Panel
	for _, side := range []string{"a", "b"} {
		p := NewPlot("panel "+side, "x", "y")
		l := NewLegend()
		s, err := NewLine(plotter.XYs{{X: 1, Y: 1}, {X: 2, Y: 4}, {X: 3, Y: 9}}, Blue, Diamond{}, vg.Points(4), false)
		if err != nil {
			t.Fatal(err)
		}
		s.AddTo(p, &l, "squares")
		d, err := NewLine(plotter.XYs{{X: 1, Y: 2}, {X: 3, Y: 2}}, Gray, nil, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		d.AddTo(p, &l, "two")
		v, err := Values(s.Markers.XYs, func(v float64) string { return "v" }, Blue, side == "b")
		if err != nil {
			t.Fatal(err)
		}
		p.Add(v)
		p.Y.Min, p.Y.Max = 0, RoundTop(9*1.1)
		panels = append(panels, Panel{Plot: p, Legend: l})
	}
	for _, side := range []Side{Below, Right} {
		f := &Figure{Width: 8 * vg.Inch, Height: 5 * vg.Inch, Title: "title", Subtitle: "subtitle", Cols: 2,
			Panels: panels, LegendSide: side, LegendSize: vg.Inch, Notes: []string{"one", "two"}}
		path := filepath.Join(t.TempDir(), "f.png")
		if err := f.Save(path); err != nil {
			t.Fatal(err)
		}
		r, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 500 {
			t.Errorf("%v pixels, want 800x500 (8x5 inches at %d DPI)", b.Size(), DPI)
		}
	}
	if err := (&Figure{}).Save(filepath.Join(t.TempDir(), "empty.png")); err == nil {
		t.Error("a figure of no panels saved")
	}
	var _ draw.GlyphDrawer = Diamond{}
}
