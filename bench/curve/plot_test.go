package main

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// TestPlot draws the committed curve.csv, as `go run ./bench/curve -plot`
// does, into a PNG of its own.
func TestPlot(t *testing.T) {
	rows, err := readCSV("curve.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("curve.csv: no rows")
	}
	path := filepath.Join(t.TempDir(), "curve.png")
	if err := writePNG(path, rows); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1600 || b.Dy() != 1000 {
		t.Errorf("%v pixels, want 1600x1000", b.Size())
	}
	if err := writePNG(path, nil); err == nil {
		t.Error("no rows plotted without an error")
	}
}

func TestFormatN(t *testing.T) {
	for n, want := range map[float64]string{30000: "30k", 1e6: "1M", 2.5e6: "2.5M", 999: "999", 12345: "12345"} {
		if got := formatN(n); got != want {
			t.Errorf("formatN(%v) = %q, want %q", n, got, want)
		}
	}
}
