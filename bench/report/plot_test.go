package main

import (
	"image/png"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/bench"
)

// TestPlot writes rows to a CSV, reads them back, as
// `go run ./bench/report -from FILE -plot PNG` does, and draws them.
func TestPlot(t *testing.T) {
	var rows []row
	for _, n := range []int{100_000, 1_000_000, 10_000_000} {
		rows = append(rows,
			row{Cache: bench.Stock, N: n, HeapInuse: 1071, Payload: 117.5, InsertNs: 10714, InsertAlloc: 31, HitNs: 5255, HitAllocs: 12},
			row{Cache: bench.Compact, N: n, Raw: true, HeapInuse: 167, StoreBytes: 167, Payload: 117.5, InsertNs: 857, HitNs: 694, ReadNs: 210})
	}
	csv := filepath.Join(t.TempDir(), "curve.csv")
	if err := writeCSV(csv, rows); err != nil {
		t.Fatal(err)
	}
	back, err := readCSV(csv)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, rows) {
		t.Fatalf("read back %+v, want %+v", back, rows)
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
	if b := img.Bounds(); b.Dx() != 2100 || b.Dy() != 900 {
		t.Errorf("%v pixels, want 2100x900", b.Size())
	}
	if err := writePNG(path, nil); err == nil {
		t.Error("no rows plotted without an error")
	}

	// A CSV written before read_ns was measured reads with ReadNs 0.
	old := filepath.Join(t.TempDir(), "old.csv")
	text := strings.Join(header[:len(header)-1], ",") + "\ncompactcache,1000000,true,167.4,167.3,0.00,172.6,117.5,1444,0.00,823,0.00,821\n"
	if err := os.WriteFile(old, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if back, err := readCSV(old); err != nil || len(back) != 1 || back[0].HitNs != 823 || back[0].ReadNs != 0 {
		t.Errorf("the CSV without read_ns: %+v, %v", back, err)
	}
}

// TestReadNs: the walk reads, and a read of memory takes time.
func TestReadNs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("measured on Linux only")
	}
	if ns := readNs(16 << 20); ns <= 0 || ns > 1e6 {
		t.Errorf("readNs(16 MiB) = %v ns", ns)
	}
}

func TestFormatN(t *testing.T) {
	for n, want := range map[float64]string{30000: "30k", 1e6: "1M", 2.5e6: "2.5M", 999: "999", 12345: "12345"} {
		if got := formatN(n); got != want {
			t.Errorf("formatN(%v) = %q, want %q", n, got, want)
		}
	}
}
